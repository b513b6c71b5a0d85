"""Stage evaluate: score models/mini_gpt_best.pt on the full val and test splits -> reports/evaluation.json."""

from pathlib import Path

from minigpt.core.io_utils import atomic_write_json
from minigpt.core.paths import EVAL_BLOCKS, EVAL_REPORT
from minigpt.core.provenance import Custody
from minigpt.core.stage import stage_main
from minigpt.evaluate.checkpoint_eval import evaluate_with_blocks


def run(params):
    custody = Custody("evaluate")
    custody.clear(EVAL_REPORT, EVAL_BLOCKS)  # a failed run leaves nothing that could pass for its result
    metrics, blocks = evaluate_with_blocks(params, Path("."), custody=custody)
    atomic_write_json(EVAL_BLOCKS, blocks)
    atomic_write_json(EVAL_REPORT, metrics)
    custody.made(EVAL_REPORT, EVAL_BLOCKS)
    custody.write()
    for split in ("val", "test"):
        m = metrics[split]
        low, high = m["bpc_ci95"]
        chars = "" if m["characters"] == m["tokens"] else f" ({m['characters']:,} characters)"
        print(f"[evaluate] {split}: loss {m['loss']:.4f} nats/token, {m['bpc']:.4f} bpc (95% interval {low:.4f} - "
              f"{high:.4f}), perplexity {m['perplexity']:.3f} over {m['tokens']:,} tokens{chars}")
    ladder = metrics["baselines"]
    for row in ladder["rows"]:
        print(f"[evaluate]   {row['name']:<22} {row['kind']:<8} val {row['val']['bpc']:.4f} bpc, test "
              f"{row['test']['bpc']:.4f}")
    margin, best = ladder["vs_best_static_bpc"], ladder["best_static"]
    print(f"[evaluate] the model beats the best static baseline ({best}) by {-margin:.4f} bpc on val" if margin < 0 else
          f"[evaluate] the model does NOT beat the best static baseline ({best}): {margin:.4f} bpc behind it on val")
    if "dynamic" in metrics:
        dynamic = metrics["dynamic"]
        print(f"[evaluate] {dynamic['label']}: val {dynamic['val']['bpc']:.4f} bpc, test {dynamic['test']['bpc']:.4f} "
              f"bpc (static: val {metrics['val']['bpc']:.4f}, test {metrics['test']['bpc']:.4f})")
    if "mixture" in metrics:
        mixture = metrics["mixture"]
        print(f"[evaluate] {mixture['label']}: {mixture['order']}-gram weight {1 - mixture['weight']:.3f}, val "
              f"{mixture['val']['bpc']:.4f} bpc, test {mixture['test']['bpc']:.4f} bpc (the {mixture['order']}-gram "
              f"alone: val {mixture['ngram']['val']['bpc']:.4f})")
    print(f"[evaluate] generalisation gap {metrics['generalization_gap_bpc']:+.4f} bpc; random baseline "
          f"{metrics['baseline_log_v']:.3f} nats per token (log V); best step {metrics['best_step']}")


if __name__ == "__main__":
    raise SystemExit(stage_main("evaluate", run))
