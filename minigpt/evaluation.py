"""Deterministic full-split scoring: every target token scored exactly once, with at least
block_size - stride tokens of context (sliding windows), batched, no_grad, eval mode."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from minigpt.checkpoint import load_checkpoint, model_from_checkpoint, require_tokenizer
from minigpt.encoding import load_ids
from minigpt.encoding import load_meta
from minigpt.errors import DataError, MinigptError
from minigpt.io_utils import read_json
from minigpt.paths import BASELINES_REPORT, BEST_CHECKPOINT, ENCODED_DIR, TOKENIZER_FILE
from minigpt.precision_choice import choose_evaluation_precision
from minigpt.runtime import autocast_for, select_device
from minigpt.tokenizer import CharTokenizer


def window_plan(num_tokens: int, block_size: int, stride: int) -> list[tuple[int, int]]:
    """(start, first scored offset) per window over targets 1..num_tokens-1.

    Window k feeds ids[s:s+T] and predicts ids[s+1:s+T+1]; it scores only the targets no earlier window scored.
    After the first window every scored target sits at offset >= T - stride, i.e. has >= T - stride + 1 tokens
    of context; the last window is aligned to the end of the split.
    """
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride must be in [1, block_size={block_size}], got {stride}")
    if num_tokens < 2:
        return []
    window = min(block_size, num_tokens - 1)
    last_start = num_tokens - 1 - window
    starts = list(range(0, last_start + 1, stride))
    if starts[-1] != last_start:
        starts.append(last_start)
    plan, scored_upto = [], 0  # targets t <= scored_upto are already scored (t counts from 1)
    for start in starts:
        plan.append((start, max(scored_upto - start, 0)))
        scored_upto = start + window
    return plan


@torch.inference_mode()  # no autograd bookkeeping at all (cheaper than no_grad)
def score_split(model, ids: np.ndarray | torch.Tensor, stride: int, batch_size: int, device: torch.device,
                precision: str = "fp32") -> dict:
    """Mean NLL over every target of the split, with perplexity and bits per character."""
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    block = model.config.block_size
    plan = window_plan(len(ids), block, stride)
    window = min(block, len(ids) - 1)
    was_training = model.training
    model.eval()
    total_nll, total_tokens = 0.0, 0
    offsets = torch.arange(window)
    try:
        for i in range(0, len(plan), batch_size):
            chunk = plan[i:i + batch_size]
            starts = torch.tensor([s for s, _ in chunk])
            first = torch.tensor([f for _, f in chunk])
            index = starts[:, None] + offsets
            inputs, targets = ids[index].to(device), ids[index + 1].to(device)
            with autocast_for(device, precision):
                logits, _ = model(inputs)
            nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
            mask = (offsets[None, :] >= first[:, None]).to(device)
            total_nll += float(nll.view(len(chunk), window)[mask].double().sum())
            total_tokens += int(mask.sum())
    finally:
        model.train(was_training)
    loss = total_nll / total_tokens
    return {"loss": loss, "perplexity": math.exp(loss), "bpc": loss / math.log(2), "tokens": total_tokens}


# ------------------------------------------------------------------------------------------- the stage

MODEL_ROW = "this model"


def load_baselines(root: Path) -> dict:
    """The baselines stage's ladder, refused unless it was computed for exactly the encoded splits here."""
    path = root / BASELINES_REPORT
    ladder = read_json(path, missing="not found", invalid="not valid JSON", fix="run `dvc repro baselines`.",
                       error=DataError)
    meta = load_meta(root / ENCODED_DIR)
    names = {r.get("name", "") for r in ladder.get("rows") or [] if isinstance(r, dict)} if isinstance(ladder, dict) else set()
    if (not isinstance(ladder, dict) or not isinstance(ladder.get("data"), dict) or ladder.get("best_static") not in names
            or not any(n.startswith("unigram") for n in names)):
        raise DataError(f"{path}: not a baselines report (needs 'rows' with the unigram and the best static baseline, "
                        "and 'data'); run `dvc repro baselines`.")
    stale = [s for s, digest in ladder["data"].items() if meta["splits"].get(s, {}).get("sha256") != digest]
    if stale:
        raise DataError(f"{path}: computed for other data (encoded {', '.join(stale)} changed since); "
                        "run `dvc repro baselines`.")
    return ladder


def compare_with_baselines(val: dict, test: dict, ladder: dict, path: str) -> dict:
    """The ladder with the model's row placed by val bpc; refuses a model that does not beat the unigram."""
    rows = {r["name"]: r for r in ladder["rows"]}
    unigram = next(r for r in ladder["rows"] if r["name"].startswith("unigram"))
    if not val["bpc"] < unigram["val"]["bpc"]:
        raise MinigptError(
            f"{path}: val {val['bpc']:.4f} bpc does not beat the unigram baseline's {unigram['val']['bpc']:.4f} bpc "
            "(train character frequencies, the same targets). Likely causes: the weights were not loaded or not "
            "trained, the tokenizer does not match the data, or the run stopped before it learned anything (too "
            "few steps, LR far too low or high). Not reporting it as a metric.")
    best = rows[ladder["best_static"]]
    ngrams = [r for r in ladder["rows"] if "order" in r and r["kind"] == "static"]
    best_ngram = min(ngrams, key=lambda r: r["val"]["bpc"]) if ngrams else None
    model_row = {"name": MODEL_ROW, "kind": "model", "val": {"bpc": val["bpc"], "tokens": val["tokens"]},
                 "test": {"bpc": test["bpc"], "tokens": test["tokens"]}}
    return {
        "rows": sorted(ladder["rows"] + [model_row], key=lambda r: -r["val"]["bpc"]),
        "best_static": best["name"],
        # negative: the model is better than every static baseline
        "vs_best_static_bpc": val["bpc"] - best["val"]["bpc"],
        "beats_ngram": None if best_ngram is None else val["bpc"] < best_ngram["val"]["bpc"],
        "best_ngram": None if best_ngram is None else best_ngram["name"],
    }


def evaluate_checkpoint(params, root, checkpoint_path=None) -> dict:
    """Score the best checkpoint on the full val and test splits; returns the report for reports/evaluation.json."""
    root = Path(root)
    path = Path(checkpoint_path) if checkpoint_path else root / BEST_CHECKPOINT
    device = select_device(params.train.device)
    checkpoint = load_checkpoint(path)
    tokenizer = CharTokenizer.load(root / TOKENIZER_FILE)
    require_tokenizer(checkpoint, tokenizer.fingerprint, str(path))
    model = model_from_checkpoint(checkpoint, device, str(path))
    block = model.config.block_size
    stride = params.evaluate.stride or max(1, block // 2)
    if stride > block:
        raise MinigptError(f"'evaluate.stride' = {stride} exceeds the checkpoint's block_size {block}.")
    # evaluate.precision auto: the faster forward pass of this model on this machine, timed here
    precision = choose_evaluation_precision(model, params.evaluate.precision, params.evaluate.batch_size, device)
    score = lambda ids: score_split(model, ids, stride, params.evaluate.batch_size, device, precision["choice"])  # noqa: E731
    ladder = load_baselines(root)  # refused before any scoring when stale or missing
    val_ids, test_ids = load_ids(root / ENCODED_DIR, "val"), load_ids(root / ENCODED_DIR, "test")
    val, test = score(val_ids), score(test_ids)
    # the same number of tokens from the start of train, to measure the generalisation gap
    train_slice = score(load_ids(root / ENCODED_DIR, "train")[: len(val_ids)])
    baseline = math.log(model.config.vocab_size)
    baselines = compare_with_baselines(val, test, ladder, str(path))
    return {
        "val": val,
        "test": test,
        "train_slice": train_slice,
        "generalization_gap": val["loss"] - train_slice["loss"],
        "baseline_log_v": baseline,
        "baseline_bpc": baseline / math.log(2),
        "baselines": baselines,
        "stride": stride,
        "min_context": block - stride + 1,
        "precision": precision,
        "best_step": checkpoint.get("best_step", checkpoint.get("step")),
        "train_seconds": checkpoint.get("elapsed_s"),
        "checkpoint": str(path),
    }
