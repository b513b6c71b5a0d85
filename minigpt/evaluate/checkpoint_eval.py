"""The evaluate stage: the best checkpoint scored on the full val and test splits (minigpt.evaluate.scoring: every
target once, with at least block_size - stride tokens of context), placed on the baselines ladder; with
evaluate.dynamic, a separate dynamic-evaluation figure (minigpt.evaluate.dynamic); with evaluate.mixture_order, a
separate figure of the model mixed with a counted n-gram (minigpt.evaluate.mixture)."""

from __future__ import annotations

import math
from pathlib import Path

from minigpt.core.errors import DataError, MinigptError
from minigpt.core.io_utils import read_json, sha256_file
from minigpt.core.paths import (
    BASELINES_REPORT,
    BEST_CHECKPOINT,
    CLEAN_DIR,
    ENCODED_DIR,
    SOFT_TARGETS_DIR,
    TOKENIZER_FILE,
    clean_split_path,
)
from minigpt.core.provenance import Custody
from minigpt.data.encode import load_ids, split_hashes
from minigpt.data.soft_target_files import (
    load_heldout_priors,
    load_soft_targets,
    load_soft_targets_summary,
    require_trained_ngram,
)
from minigpt.evaluate.dynamic import LABEL as DYNAMIC_LABEL
from minigpt.evaluate.dynamic import dynamic_score
from minigpt.evaluate.intervals import bpc_interval, character_blocks
from minigpt.evaluate.mixture import mixture_figures
from minigpt.evaluate.scoring import summarise, target_chars, target_nll
from minigpt.evaluate.scoring_checks import determinism, scoring_checks
from minigpt.model.checkpoint import load_trained_model
from minigpt.model.devices import select_device
from minigpt.model.mode_probe import ModeProbe
from minigpt.model.precision import choose_evaluation_precision

# ------------------------------------------------------------------------------------------- the stage

MODEL_ROW = "this model"


def load_baselines(root: Path) -> dict:
    """The baselines stage's ladder, refused unless it was computed for exactly the clean splits here."""
    path = root / BASELINES_REPORT
    ladder = read_json(path, missing="not found", invalid="not valid JSON", fix="run `dvc repro baselines`.",
                       error=DataError)
    rows = (ladder.get("rows") or []) if isinstance(ladder, dict) else []
    names = {r.get("name", "") for r in rows if isinstance(r, dict)}
    if (not isinstance(ladder, dict) or not isinstance(ladder.get("data"),
                                                       dict) or ladder.get("best_static") not in names
            or not any(n.startswith("unigram") for n in names)):
        raise DataError(f"{path}: not a baselines report (needs 'rows' with the unigram and the best static baseline, "
                        "and 'data'); run `dvc repro baselines`.")
    clean = {s: clean_split_path(s, root / CLEAN_DIR) for s in ladder["data"]}
    stale = [s for s, digest in ladder["data"].items() if not clean[s].is_file() or sha256_file(clean[s]) != digest]
    if stale:
        raise DataError(f"{path}: computed for other data (clean {', '.join(stale)} changed since); "
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


def expert_priors(model, checkpoint: dict, root: Path, source: str, custody: Custody | None) -> dict:
    """model.ngram_expert: the n-gram's priors of every split evaluate scores (val, test, and train's cross-fitted
    ones for the train slice), refused unless data/soft_targets holds the n-gram the checkpoint was trained with;
    {} for any other model."""
    if not model.config.ngram_expert:
        return {}
    if custody is not None:
        custody.take("soft targets")
        custody.take("n-gram priors")
    folder, encoded = root / SOFT_TARGETS_DIR, root / ENCODED_DIR
    require_trained_ngram(checkpoint, load_soft_targets_summary(folder, encoded), source)
    return {**load_heldout_priors(folder, encoded), "train": load_soft_targets(folder, encoded).priors()}


def evaluate_checkpoint(params, root, checkpoint_path=None) -> dict:
    """Score the best checkpoint on the full val and test splits; returns the report for reports/evaluation.json."""
    return evaluate_with_blocks(params, root, checkpoint_path)[0]


def evaluate_with_blocks(params, root, checkpoint_path=None, custody: Custody | None = None) -> tuple[dict, dict]:
    """The report for reports/evaluation.json, and per split the summed NLL of contiguous blocks of the scored
    targets (reports/eval_blocks.json: what a paired comparison of two runs resamples). `custody` (the stage's
    record; the default checkpoint only) checks every input against its producer's record and records the tokens
    each figure scored."""
    root = Path(root)
    path = Path(checkpoint_path) if checkpoint_path else root / BEST_CHECKPOINT
    if custody is not None:
        for role in ("checkpoint", "tokenizer", "val", "test", "train slice", "baselines"):
            custody.take(role)
    device = select_device(params.train.device)
    model, tokenizer, checkpoint = load_trained_model(path, root / TOKENIZER_FILE, device)
    char_counts = tokenizer.char_counts()  # bits per character, whatever a token holds
    block = model.config.block_size
    stride = params.evaluate.stride or max(1, block // 2)
    if stride > block:
        raise MinigptError(f"'evaluate.stride' = {stride} exceeds the checkpoint's block_size {block}.")
    # evaluate.precision auto: the faster forward pass of this model on this machine, timed here
    precision = choose_evaluation_precision(model, params.evaluate.precision, params.evaluate.batch_size, device)

    settings = params.evaluate

    priors = expert_priors(model, checkpoint, root, str(path), custody)

    def score(ids, split):
        return summarise(nll_of(ids, split), target_chars(ids, char_counts))

    probe = ModeProbe(model)  # every module's mode whenever a static figure is scored

    def nll_of(ids, split):
        with probe:
            return target_nll(model, ids, stride, settings.batch_size, device, precision["choice"], priors.get(split))

    ladder = load_baselines(root)  # refused before any scoring when stale or missing
    val_ids, test_ids = load_ids(root / ENCODED_DIR, "val"), load_ids(root / ENCODED_DIR, "test")
    hashes = split_hashes(root / ENCODED_DIR, ("val", "test"))
    blocks = {"blocks": settings.blocks, "resamples": settings.bootstrap_resamples, "seed": settings.bootstrap_seed,
              "checkpoint": str(path), "tokenizer": tokenizer.fingerprint, "splits": {}}
    scored, per_target = {}, {}
    for split, ids in (("val", val_ids), ("test", test_ids)):
        if custody is not None:
            custody.used(split, ids)
        nll, chars = nll_of(ids, split), target_chars(ids, char_counts)
        per_target[split] = (ids, nll, chars)
        cut = character_blocks(nll, chars, int(char_counts[ids[0]]), settings.blocks)
        scored[split] = {**summarise(nll, chars), "bpc_ci95": bpc_interval(
            cut["nll"], cut["chars"], settings.bootstrap_resamples, settings.bootstrap_seed)}
        # "text_sha256" (the clean split the baselines verified) and the character cut let runs of two tokenizers
        # be paired block by block
        blocks["splits"][split] = {"sha256": hashes[split], "text_sha256": ladder["data"].get(split),
                                   "cut": "characters", "tokens": cut["tokens"].tolist(),
                                   "chars": cut["chars"].tolist(), "nll": cut["nll"].tolist()}
    val, test = scored["val"], scored["test"]
    # the same number of tokens from the start of train, to measure the generalisation gap
    train_ids = load_ids(root / ENCODED_DIR, "train")
    slice_ids = train_ids[: len(val_ids)]
    if custody is not None:
        custody.used("train slice", slice_ids)
    train_slice = score(slice_ids, "train")
    checks = scoring_checks(probe, determinism(lambda ids: nll_of(ids, "val"), val_ids, block), str(path))
    baseline = math.log(model.config.vocab_size)
    baselines = compare_with_baselines(val, test, ladder, str(path))
    report = {
        "val": val,
        "test": test,
        "train_slice": train_slice,
        "generalization_gap": val["loss"] - train_slice["loss"],  # nats per token
        "generalization_gap_bpc": val["bpc"] - train_slice["bpc"],
        "baseline_log_v": baseline,
        "baseline_bpc": baseline / math.log(2),
        "baselines": baselines,
        "stride": stride,
        "min_context": block - stride + 1,
        "precision": precision,
        "best_step": checkpoint.get("best_step", checkpoint.get("step")),
        "train_seconds": checkpoint.get("elapsed_s"),
        "checkpoint": str(path),
        "scoring_checks": checks,
        # model.ngram_expert: every figure is of the output mixed with this n-gram (null: the network alone)
        "ngram_expert": checkpoint.get("ngram_expert_source") if priors else None,
        "interval": {"method": "bootstrap over contiguous blocks of the scored targets", "level": 0.95,
                     "blocks": settings.blocks, "resamples": settings.bootstrap_resamples,
                     "seed": settings.bootstrap_seed},
    }
    if settings.dynamic:  # its own key and label: the static figures above are never changed by it
        def dynamic(ids, split):
            return dynamic_score(model, ids, stride, settings.dynamic_streams, settings.dynamic_lr, device,
                                 precision["choice"], char_counts, priors.get(split))

        report["dynamic"] = {"label": DYNAMIC_LABEL, "lr": settings.dynamic_lr, "val": dynamic(val_ids, "val"),
                             "test": dynamic(test_ids, "test")}
    if settings.mixture_order:  # its own key and label, like dynamic
        report["mixture"] = mixture_figures(train_ids, per_target, tokenizer.vocab_size, settings.mixture_order,
                                            params.baselines.discount)
    return report, blocks
