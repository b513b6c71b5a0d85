"""Stage generate: samples for people (reports/samples.md) and repetition metrics (reports/generation.json)."""

from pathlib import Path

from minigpt.core.io_utils import atomic_write_json, atomic_write_text
from minigpt.core.paths import GENERATION_REPORT, SAMPLES_MD
from minigpt.core.provenance import Custody
from minigpt.core.stage import stage_main
from minigpt.evaluate.generation import generate_samples


def run(params):
    custody = Custody("generate")
    custody.clear(GENERATION_REPORT, SAMPLES_MD)  # a failed run leaves nothing that could pass for its result
    checkpoint = custody.take("checkpoint")
    custody.take("tokenizer")
    report, markdown = generate_samples(params, Path("."), checkpoint, custody)
    atomic_write_json(GENERATION_REPORT, report)
    atomic_write_text(SAMPLES_MD, markdown + "\n")
    custody.made(GENERATION_REPORT, SAMPLES_MD)
    custody.write()
    mean = report["mean"]
    print(f"[generate] {len(report['samples'])} samples; repeated 4-grams {mean['repeated_4gram_share']:.1%}, "
          f"longest repeated substring {mean['longest_repeated_substring']:.0f} chars")
    print(markdown)


if __name__ == "__main__":
    raise SystemExit(stage_main("generate", run))
