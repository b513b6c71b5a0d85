"""The whole chain of custody verified from the files: every link of the declared graph (minigpt.core.provenance
CONSUMES: a consumer, the role it reads, the artifact, its producer) is held to four things, each recomputed here
rather than taken from the stage that wrote the record:

1. the consumer recorded reading the role, from the artifact the graph declares for it;
2. what it read is what the producer recorded writing;
3. the file is still what the consumer read;
4. the values it used (the tokens it scored, the characters a baseline was fitted on) are the artifact's own
   values at the range it names, recomputed from the file.

The report stage refuses to write decision metrics from a broken chain, and the run page shows every link.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minigpt.core.errors import MinigptError
from minigpt.core.io_utils import sha256_file
from minigpt.core.paths import CLEAN_DIR, clean_split_path
from minigpt.core.provenance import CONSUMES, RECORDS, UNRECORDED, CustodyError, load_record, values_digest
from minigpt.core.stage import read_text
from minigpt.data.tokenizer import CharTokenizer

OK, BROKEN, UNUSED = "ok", "broken", "not used"


class BrokenChain(MinigptError):
    """A link of the chain of custody does not hold: the reported numbers may not come from what they claim."""


def _load_records(root: Path) -> tuple[dict[str, dict], dict[str, str]]:
    records, missing = {}, {}
    for stage in RECORDS:
        try:
            records[stage] = load_record(root, stage)
        except CustodyError as exc:
            missing[stage] = str(exc)
    return records, missing


def _used_values(root: Path, artifact: str, used: dict):
    """The values a consumer says it used, recomputed from the artifact."""
    start, stop = used["start"], used["stop"]
    if used.get("kind", "ids") == "ids":
        return np.load(root / artifact, mmap_mode="r", allow_pickle=False)[start:stop]
    if used["kind"] == "characters":  # character IDs over the vocabulary of clean train + the placeholder
        vocabulary = CharTokenizer.from_text(read_text(clean_split_path("train", root / CLEAN_DIR)),
                                             placeholder=used.get("placeholder"))
        return vocabulary.encode(read_text(root / artifact))[start:stop]
    raise ValueError(f"unknown kind {used['kind']!r}")


def _link_problem(root: Path, consumer: str, role: str, declared, entry: dict | None, records: dict,
                  missing: dict) -> str | None:
    """Why the link fails, or None when it holds."""
    if entry is None:
        if consumer not in RECORDS:
            return f"{declared.artifact} not found"
        return f"'{consumer}' did not record reading its {role}"
    if entry.get("artifact") != str(declared.artifact):
        return f"'{consumer}' read {entry.get('artifact')} as its {role}; the graph declares {declared.artifact}"
    read = entry.get("sha256")
    if declared.producer not in UNRECORDED:
        if declared.producer not in records:
            return missing[declared.producer]
        made = records[declared.producer]["outputs"].get(str(declared.artifact))
        if made != read:
            return (f"'{consumer}' read a version of {declared.artifact} that '{declared.producer}' did not record "
                    "writing (a stage ran on a stale artifact)")
    path = root / declared.artifact
    if not path.is_file():
        return f"{declared.artifact} is gone since '{consumer}' read it"
    if sha256_file(path) != read:
        return f"{declared.artifact} changed after '{consumer}' read it"
    used = entry.get("used")
    if used is not None:
        try:
            values = _used_values(root, str(declared.artifact), used)
        except (KeyError, ValueError, MinigptError) as exc:
            return f"the values '{consumer}' used as its {role} cannot be recomputed ({exc})"
        if len(values) != used["stop"] - used["start"] or values_digest(values) != used["sha256"]:
            return (f"'{consumer}' used other values as its {role} than {declared.artifact}[{used['start']}:"
                    f"{used['stop']}] (digest {used['sha256'][:12]}, the file's {values_digest(values)[:12]})")
    return None


def verify_chain(root: Path = Path(".")) -> dict:
    """Every link's status: {"intact": bool, "links": [{consumer, role, artifact, producer, status, problem}]}."""
    root = Path(root)
    records, missing = _load_records(root)
    links = []
    for consumer, roles in CONSUMES.items():
        inputs = records[consumer]["inputs"] if consumer in records else None
        for role, declared in roles.items():
            link = {"consumer": consumer, "role": role, "artifact": str(declared.artifact),
                    "producer": declared.producer}
            if consumer in RECORDS and inputs is None:
                problem = missing[consumer]
            else:
                entry = (inputs or {}).get(role) if consumer in RECORDS else _current(root, declared, records)
                if entry is None and not declared.required:
                    links.append({**link, "status": UNUSED, "problem": ""})
                    continue
                problem = _link_problem(root, consumer, role, declared, entry, records, missing)
            links.append({**link, "status": BROKEN if problem else OK, "problem": problem or ""})
    return {"intact": all(link["status"] != BROKEN for link in links), "links": links}


def _current(root: Path, declared, records: dict) -> dict | None:
    """A consumer without a record of its own (the report stage) reads the artifacts as they are now."""
    path = root / declared.artifact
    if not path.is_file():
        return None
    return {"artifact": str(declared.artifact), "sha256": sha256_file(path)}


def require_intact(chain: dict) -> None:
    broken = [link for link in chain["links"] if link["status"] == BROKEN]
    if broken:
        first = broken[0]
        more = f" (and {len(broken) - 1} more broken link(s): see the run page)" if len(broken) > 1 else ""
        raise BrokenChain(
            f"chain of custody broken at {first['producer']} -> {first['consumer']} ({first['role']}, "
            f"{first['artifact']}): {first['problem']}{more}. Not writing decision metrics from it; rerun the "
            f"stages from '{first['producer']}' on (`dvc repro`).")
