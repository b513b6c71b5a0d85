"""Stage soft_targets: every train position's next-token distribution from an n-gram counted without that
position's fold, and every val and test position's from the n-gram counted on all of train -> data/soft_targets/
(what train.distill_alpha mixes into the training loss, and model.ngram_expert into the model's output)."""

from minigpt.core.paths import ENCODED_DIR, SOFT_TARGETS_DIR
from minigpt.core.provenance import NGRAM_PRIORS_FILE, SOFT_TARGETS_FILE, Custody
from minigpt.core.stage import stage_main
from minigpt.data.soft_target_files import SUMMARY_NAME, build_soft_targets


def run(params):
    cfg = params.soft_targets
    custody = Custody("soft_targets")
    summary = build_soft_targets(ENCODED_DIR, SOFT_TARGETS_DIR, cfg.order, cfg.top, cfg.folds,
                                 params.baselines.discount, custody)
    custody.made(SOFT_TARGETS_DIR / SUMMARY_NAME, *([SOFT_TARGETS_FILE, NGRAM_PRIORS_FILE] if cfg.order else []))
    custody.write()
    if not cfg.order:
        print("[soft_targets] soft_targets.order 0: none built (train.distill_alpha must be 0)")
        return
    print(f"[soft_targets] {summary['positions']:,} positions, order {cfg.order}, {cfg.folds} folds, top "
          f"{summary['top']}: {summary['bits_per_token']:.3f} bits/token held out, {summary['kept_mass']:.3f} of "
          f"the mass kept ({summary['seconds']:.1f} s); counted on all of train: "
          + ", ".join(f"{split} {bits:.3f}" for split, bits in summary["heldout_bits_per_token"].items())
          + " bits/token")


if __name__ == "__main__":
    raise SystemExit(stage_main("soft_targets", run))
