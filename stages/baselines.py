"""Stage baselines: classical predictors of the characters of val and test, fitted on clean train ->
data/baselines/baselines.json (whichever tokenizer the model uses)."""

from minigpt.core.io_utils import atomic_write_json
from minigpt.core.paths import BASELINES_REPORT, CLEAN_DIR
from minigpt.core.provenance import Custody
from minigpt.core.stage import stage_main
from minigpt.evaluate.baselines import baseline_ladder


def run(params):
    custody = Custody("baselines")
    ladder = baseline_ladder(CLEAN_DIR, params.clean.placeholder, params.baselines, custody)
    atomic_write_json(BASELINES_REPORT, ladder)
    custody.made(BASELINES_REPORT)
    custody.write()
    for row in ladder["rows"]:
        print(f"[baselines] {row['name']:<22} {row['kind']:<8} val {row['val']['bpc']:.4f} bpc, test "
              f"{row['test']['bpc']:.4f} bpc ({row['seconds']:.1f} s)")
    print(f"[baselines] best static baseline: {ladder['best_static']}")


if __name__ == "__main__":
    raise SystemExit(stage_main("baselines", run))
