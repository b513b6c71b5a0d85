"""The project's own text: no string literal split where the joined line would fit (the trace of an automatic
reflow, e.g. `missing="not " "found"`), and conf/ comments a quarter of its lines at most (a comment says what a
key does; the story of a measurement lives in docs/)."""

import ast
import io
import re
import tokenize
from pathlib import Path

from helpers import REPO_ROOT

LINE_LIMIT = 120  # pyproject.toml [tool.ruff] line-length
PYTHON_DIRS = ("minigpt", "stages", "benchmarks", "tests")
CONF_COMMENT_SHARE_MAX = 0.25


def _prefix(literal: str) -> str:
    return re.match(r"[rRbBfFuU]*", literal).group(0).lower()


def needless_splits(source: str) -> list[int]:
    """Lines where a string literal ends and the next one, same quotes and prefix, on the following line, would fit
    on the first line together with what follows it."""
    lines = source.splitlines()
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.NL, tokenize.COMMENT)]
    found = []
    for first, second in zip(tokens, tokens[1:]):
        if first.type != tokenize.STRING or second.type != tokenize.STRING:
            continue
        if first.end[0] == second.start[0] or second.start[0] != second.end[0]:
            continue
        prefix = _prefix(second.string)
        if prefix != _prefix(first.string) or first.string[-1] != second.string[-1] or second.string.endswith('"""'):
            continue
        content = second.string[len(prefix) + 1:-1]
        if content.endswith("\\n"):  # a program or text written line by line
            continue
        line = lines[first.end[0] - 1].rstrip()
        rest = lines[second.end[0] - 1][second.end[1]:].rstrip()
        if first.end[1] == len(line) and len(line) + len(content) + len(rest) <= LINE_LIMIT:
            found.append(first.end[0])
    return found


def test_the_detector_finds_a_reflow_fragment_and_passes_a_needed_split():
    fragment = 'meta = read_json(path, missing="not "\n                              "found")\n'
    assert needless_splits(fragment) == [1]
    needed = f'message = ("{"x" * 100} "\n           "{"y" * 30}")\n'
    assert needless_splits(needed) == []
    assert ast.parse(fragment) and ast.parse(needed)


def test_no_string_literal_is_split_where_it_would_fit_on_one_line():
    found = [f"{path.relative_to(REPO_ROOT)}:{line}" for folder in PYTHON_DIRS
             for path in sorted((REPO_ROOT / folder).rglob("*.py")) for line in needless_splits(path.read_text())]
    assert found == [], f"join these string literals (they fit on one line): {found}"


def comment_share(files: list[Path]) -> float:
    lines = [line for path in files for line in path.read_text().splitlines()]
    return sum(line.lstrip().startswith("#") for line in lines) / len(lines)


def test_conf_comments_are_at_most_a_quarter_of_its_lines(tmp_path):
    share = comment_share(sorted((REPO_ROOT / "conf").rglob("*.yaml")))
    assert share <= CONF_COMMENT_SHARE_MAX, f"conf/: {share:.0%} of the lines are comments"
    narrated = tmp_path / "narrated.yaml"
    narrated.write_text("# measured on a 2-core EPYC, a later series\n# three seeds each\nlr: 0.001\n")
    assert comment_share([narrated]) > CONF_COMMENT_SHARE_MAX
