"""Stage fetch: WikiText raw files (local copy or download), verified, into data/raw/."""

from minigpt.core.paths import RAW_DIR
from minigpt.core.stage import stage_main
from minigpt.data.fetch import fetch


def run(params):
    manifest = fetch(params.data, RAW_DIR)
    sizes = ", ".join(f"{split} {info['characters']:,} chars" for split, info in manifest["files"].items())
    verified = manifest["verified_against"] or "not checked (data=local)"
    print(f"[fetch] {manifest['origin']} -> {RAW_DIR}: {sizes}; official hashes: {verified}")


if __name__ == "__main__":
    raise SystemExit(stage_main("fetch", run))
