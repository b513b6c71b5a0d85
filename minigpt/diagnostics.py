"""Preflight diagnostics: one named check per assumption, run in the order the data flows.

Each check isolates one assumption of the pipeline and either returns what it measured or raises CheckFailed
with the measurement, the threshold and the likely causes (the debugging guide's symptom -> cause map).
Checks whose prerequisites did not pass are reported as skipped, with the reason.
"""

from __future__ import annotations

import copy
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

from minigpt import batching
from minigpt.config import Params
from minigpt.device import mps_available, select_device
from minigpt.encoding import load_ids, load_meta
from minigpt.errors import MinigptError
from minigpt.io_utils import atomic_write_json, canonical_json_digest, read_json, sha256_file
from minigpt.model import MiniGPT, MiniGPTConfig
from minigpt.nonfinite import NonFiniteTracker
from minigpt.optim import make_adamw
from minigpt.paths import DEBUG_REPORT, ENCODED_DIR, SPLITS, TOKENIZER_FILE, clean_split_path
from minigpt.tokenizer import CharTokenizer

# The guide's debug model, used by single_batch_overfit whatever model is configured for training.
DEBUG_MODEL = dict(block_size=32, embedding_dim=64, num_heads=4, num_layers=2, expansion_factor=4, dropout=0.0)
CAUSAL_ATOL = 1e-5
CAUSAL_GRAD_ATOL = 1e-10


class CheckFailed(Exception):
    def __init__(self, message: str, measured: dict | None = None):
        super().__init__(message)
        self.measured = measured or {}


@dataclass
class CheckResult:
    name: str
    status: str  # passed | failed | skipped
    measured: dict
    threshold: str
    seconds: float
    message: str = ""
    likely_causes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = {
            "name": self.name,
            "status": self.status,
            "passed": self.status == "passed",
            "measured": self.measured,
            "threshold": self.threshold,
            "seconds": round(self.seconds, 4),
        }
        if self.status != "passed":
            out["message"] = self.message
        if self.status == "failed":
            out["likely_causes"] = self.likely_causes
        return out


@dataclass
class Context:
    """What the checks share: inputs, the artifacts they load, and what earlier checks produced."""

    params: Params
    root: Path
    device: torch.device
    model_config: MiniGPTConfig | None = None
    model_factory: Callable[[MiniGPTConfig], nn.Module] = MiniGPT
    # filled by the checks
    tokenizer: CharTokenizer | None = None
    meta: dict | None = None
    splits: dict[str, torch.Tensor] = field(default_factory=dict)
    batch: tuple[torch.Tensor, torch.Tensor] | None = None
    model: nn.Module | None = None
    summary: dict = field(default_factory=dict)

    def path(self, relative: Path) -> Path:
        return self.root / relative

    def generator(self, offset: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(self.params.preflight.seed + offset)

    def seed_all(self, offset: int = 0) -> None:
        torch.manual_seed(self.params.preflight.seed + offset)


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Context], dict]
    needs: tuple[str, ...]
    threshold: str | Callable[[Context], str]
    likely_causes: tuple[str, ...]

    def threshold_text(self, ctx: Context) -> str:
        return self.threshold(ctx) if callable(self.threshold) else self.threshold


# ------------------------------------------------------------------------------------------------ the checks

def check_environment(ctx: Context) -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "device": str(ctx.device),
        "cuda_available": torch.cuda.is_available(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "mps_available": mps_available(),
        "threads": torch.get_num_threads(),
    }


def required_files(ctx: Context) -> list[Path]:
    return [
        ctx.path(clean_split_path("train")),
        ctx.path(TOKENIZER_FILE),
        ctx.path(ENCODED_DIR / "meta.json"),
        *[ctx.path(ENCODED_DIR / f"{split}.npy") for split in SPLITS],
    ]


def check_files(ctx: Context) -> dict:
    sizes, problems = {}, []
    for path in required_files(ctx):
        key = str(path.relative_to(ctx.root)) if path.is_relative_to(ctx.root) else str(path)
        if not path.is_file():
            problems.append(f"{key} is missing")
        elif path.stat().st_size == 0:
            problems.append(f"{key} is empty")
        else:
            sizes[key] = path.stat().st_size
    if problems:
        raise CheckFailed("; ".join(problems), {"sizes": sizes})
    try:
        ctx.tokenizer = CharTokenizer.load(ctx.path(TOKENIZER_FILE))
        ctx.meta = load_meta(ctx.path(ENCODED_DIR))
    except MinigptError as exc:
        raise CheckFailed(str(exc), {"sizes": sizes}) from None
    changed = [
        split for split in SPLITS
        if sha256_file(ctx.path(ENCODED_DIR / f"{split}.npy")) != ctx.meta["splits"][split]["sha256"]
    ]
    if changed:
        raise CheckFailed(f"encoded arrays changed after encode (SHA-256 differs from meta.json): {', '.join(changed)}", {"sizes": sizes})
    return {"sizes": sizes}


def check_tokenizer(ctx: Context) -> dict:
    tok = ctx.tokenizer
    ids = np.asarray(load_ids(ctx.path(ENCODED_DIR), "train")[: ctx.params.preflight.tokenizer_chars], dtype=np.int64)
    n = int(ids.size)
    measured = {"chars_checked": n, "tokenizer_fingerprint": tok.fingerprint, "encoded_with": ctx.meta["tokenizer_fingerprint"]}
    ctx.summary.update(tokenizer_fingerprint=tok.fingerprint, vocab_size=tok.vocab_size)
    try:
        decoded = tok.decode(ids)
        reencoded = tok.encode(decoded)
    except MinigptError as exc:
        raise CheckFailed(f"round trip failed: {exc}", measured) from None
    clean_prefix = ctx.path(clean_split_path("train")).read_bytes().decode("utf-8")[:n]
    mismatch = next((i for i, (a, b) in enumerate(zip(decoded, clean_prefix)) if a != b), None)
    if mismatch is None and len(decoded) != len(clean_prefix):
        mismatch = min(len(decoded), len(clean_prefix))
    measured.update(round_trip_equal=bool(np.array_equal(reencoded, ids)), matches_clean_text=mismatch is None,
                    first_mismatch=mismatch)
    problems = []
    if not measured["round_trip_equal"]:
        problems.append("encode(decode(ids)) != ids on the first train IDs")
    if mismatch is not None:
        problems.append(
            f"decoded train IDs differ from data/clean/train.txt at character {mismatch}: "
            f"{decoded[mismatch:mismatch + 20]!r} vs {clean_prefix[mismatch:mismatch + 20]!r}"
        )
    if ctx.meta["tokenizer_fingerprint"] != tok.fingerprint:
        problems.append("data/encoded was encoded with a different tokenizer than data/tokenizer/char_tokenizer.json "
                        "(fingerprints differ)")
    if problems:
        raise CheckFailed("; ".join(problems), measured)
    return measured


def check_token_ids(ctx: Context) -> dict:
    vocab = ctx.tokenizer.vocab_size
    ranges, bad = {}, []
    for split in SPLITS:
        ids = load_ids(ctx.path(ENCODED_DIR), split)
        lo, hi = int(ids.min()), int(ids.max())
        ranges[split] = {"dtype": str(ids.dtype), "min": lo, "max": hi, "length": int(ids.size)}
        if ids.dtype.kind not in "ui":
            bad.append(f"{split}: dtype {ids.dtype} is not an integer type")
        elif lo < 0 or hi >= vocab:
            bad.append(f"{split}: IDs span [{lo}, {hi}] but must lie in [0, {vocab - 1}]")
    ctx.summary["token_range"] = ranges
    measured = {"vocab_size": vocab, "splits": ranges}
    if bad:
        raise CheckFailed("; ".join(bad), measured)
    ctx.splits = {split: torch.from_numpy(np.asarray(load_ids(ctx.path(ENCODED_DIR), split), dtype=np.int64)) for split in SPLITS}
    return measured


def check_batch_shift(ctx: Context) -> dict:
    cfg = ctx.model_config
    batch_size = ctx.params.preflight.batch_size
    inputs, targets = batching.get_batch(ctx.splits["train"], batch_size, cfg.block_size, ctx.device, ctx.generator(1))
    measured = {
        "inputs_shape": list(inputs.shape),
        "targets_shape": list(targets.shape),
        "dtypes": [str(inputs.dtype), str(targets.dtype)],
        "device": str(inputs.device),
    }
    problems = []
    if inputs.shape != targets.shape or list(inputs.shape) != [batch_size, cfg.block_size]:
        problems.append(f"shapes {list(inputs.shape)} / {list(targets.shape)}, expected [{batch_size}, {cfg.block_size}] both")
    if inputs.dtype != torch.long or targets.dtype != torch.long:
        problems.append(f"dtypes {inputs.dtype} / {targets.dtype}, expected torch.int64")
    if inputs.device.type != ctx.device.type or targets.device.type != ctx.device.type:
        problems.append(f"batch on {inputs.device}, model on {ctx.device}")
    if not problems:
        shifted = bool(torch.equal(inputs[:, 1:], targets[:, :-1]))
        identical = float((inputs == targets).float().mean())
        measured.update(shift_ok=shifted, identical_fraction=round(identical, 4))
        if not shifted:
            problems.append("inputs[:, 1:] != targets[:, :-1]: targets are not the inputs shifted by one")
        elif identical == 1.0:
            problems.append("targets equal inputs")
    if problems:
        raise CheckFailed("; ".join(problems), measured)
    ctx.batch = (inputs, targets)
    ctx.summary["batch_shape"] = list(inputs.shape)
    return measured


def check_forward_shapes(ctx: Context) -> dict:
    ctx.seed_all(2)
    model = ctx.model_factory(ctx.model_config).to(ctx.device)
    ctx.model = model
    inputs, targets = ctx.batch
    model.eval()
    with torch.no_grad(), NonFiniteTracker(model) as tracker:
        logits, loss = model(inputs, targets)
    expected = [inputs.shape[0], inputs.shape[1], ctx.model_config.vocab_size]
    measured = {"logits_shape": list(logits.shape), "expected_shape": expected, "loss_shape": list(loss.shape),
                "loss": float(loss), "parameters": sum(p.numel() for p in model.parameters())}
    if list(logits.shape) != expected:
        raise CheckFailed(f"logits shape {list(logits.shape)}, expected {expected}", measured)
    if loss.dim() != 0:
        raise CheckFailed(f"loss is not a scalar (shape {list(loss.shape)})", measured)
    if not torch.isfinite(loss):
        measured["first_nonfinite_module"] = tracker.first
        raise CheckFailed(f"loss is {float(loss)}; first non-finite output in module '{tracker.first}'", measured)
    return measured


def check_initial_loss(ctx: Context) -> dict:
    model = ctx.model
    model.eval()
    with torch.no_grad():
        _, loss = model(*ctx.batch)
    expected = math.log(ctx.model_config.vocab_size)
    tol = ctx.params.preflight.initial_loss_tolerance
    loss = float(loss)
    ctx.summary.update(initial_loss=loss, expected_initial_loss=expected)
    measured = {"initial_loss": round(loss, 5), "expected_log_v": round(expected, 5), "difference": round(loss - expected, 5)}
    if loss > expected + tol:
        raise CheckFailed(
            f"initial loss {loss:.4f} is far ABOVE log(V) = {expected:.4f}: the model starts confidently wrong "
            "(extreme initial logits / too-large init, targets that do not match the inputs, or a loss on wrong IDs)",
            measured,
        )
    if loss < expected - tol:
        raise CheckFailed(
            f"initial loss {loss:.4f} is far BELOW log(V) = {expected:.4f}: an untrained model cannot do better than "
            "chance, so it sees the answer (future tokens visible through the mask, unshifted targets with a copy "
            "path, or weights loaded instead of a fresh init)",
            measured,
        )
    return measured


def check_causal_independence(ctx: Context) -> dict:
    model = ctx.model
    model.eval()
    inputs = ctx.batch[0][:2]
    time_steps = inputs.shape[1]
    if time_steps < 2:
        return {"skipped_reason": "block_size 1 has no future"}
    cut = time_steps // 2
    changed = inputs.clone()
    # a different suffix: rotate every future ID (guaranteed to differ when V > 1)
    changed[:, cut:] = (changed[:, cut:] + 1) % ctx.model_config.vocab_size
    with torch.no_grad():
        a, _ = model(inputs)
        b, _ = model(changed)
    prefix_diff = float((a[:, :cut] - b[:, :cut]).abs().max())
    suffix_diff = float((a[:, cut:] - b[:, cut:]).abs().max())

    # gradient proof: d(logits at t) / d(input embedding at t' > t) must be exactly zero
    captured = {}

    def keep_grad(_module, _inputs, output):
        # replace the embedding output by a leaf, so its gradient exists even if parameters are frozen
        leaf = output.detach().requires_grad_(True)
        captured["emb"] = leaf
        return leaf

    embedding = _token_embedding(model)
    handle = embedding.register_forward_hook(keep_grad)
    try:
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            logits, _ = model(inputs)
            t = cut - 1
            logits[:, t].float().pow(2).sum().backward()
    finally:
        handle.remove()
    grad = captured["emb"].grad
    future_grad = float(grad[:, t + 1:].abs().max())
    past_grad = float(grad[:, : t + 1].abs().max())
    model.zero_grad(set_to_none=True)
    measured = {
        "prefix_max_abs_diff": prefix_diff,
        "suffix_max_abs_diff": suffix_diff,
        "position": t,
        "future_grad_max": future_grad,
        "past_grad_max": past_grad,
    }
    if prefix_diff > CAUSAL_ATOL or future_grad > CAUSAL_GRAD_ATOL:
        raise CheckFailed(
            f"logits before position {cut} depend on later tokens (prefix diff {prefix_diff:.2e}, "
            f"d logits[{t}] / d embedding[>{t}] = {future_grad:.2e}): the causal mask is missing or wrong",
            measured,
        )
    if past_grad == 0.0:
        raise CheckFailed("no gradient reaches even the past embeddings: the check is not measuring anything", measured)
    return measured


def _token_embedding(model: nn.Module) -> nn.Module:
    if hasattr(model, "tok_emb"):
        return model.tok_emb
    return next(m for m in model.modules() if isinstance(m, nn.Embedding))


def check_gradients(ctx: Context) -> dict:
    model = ctx.model
    model.train()
    model.zero_grad(set_to_none=True)
    named = list(model.named_parameters())
    trainable = [(n, p) for n, p in named if p.requires_grad]
    frozen = [n for n, p in named if not p.requires_grad]
    measured: dict[str, Any] = {"trainable": len(trainable), "frozen": len(frozen)}
    if not trainable:
        ctx.summary.update(grad_norm=0.0, missing_gradients=[n for n, _ in named])
        raise CheckFailed("no parameter requires grad: every parameter is frozen", measured)
    ctx.seed_all(3)
    with NonFiniteTracker(model) as tracker:
        _, loss = model(*ctx.batch)
        loss.backward()
    missing = [n for n, p in trainable if p.grad is None]
    nonfinite = [n for n, p in trainable if p.grad is not None and not torch.isfinite(p.grad).all()]
    all_zero = [n for n, p in trainable if p.grad is not None and n not in nonfinite and not p.grad.any()]
    norms = {n: float(p.grad.norm()) for n, p in trainable if p.grad is not None}
    global_norm = math.sqrt(sum(v * v for v in norms.values()))
    measured.update(global_norm=global_norm, missing=missing, nonfinite=nonfinite, all_zero=all_zero,
                    frozen_names=frozen[:20], per_parameter_norms=norms)
    if tracker.first:
        measured["first_nonfinite_module"] = tracker.first
    ctx.summary.update(grad_norm=global_norm, missing_gradients=missing)
    model.zero_grad(set_to_none=True)
    problems = []
    if missing:
        problems.append(f"no gradient for {', '.join(missing)} (defined but not used in forward, or detached)")
    if nonfinite:
        problems.append(f"non-finite gradients in {', '.join(nonfinite)} (first non-finite module: {tracker.first})")
    if all_zero:
        problems.append(f"all-zero gradients for {', '.join(all_zero)}")
    if problems:
        raise CheckFailed("; ".join(problems), measured)
    return measured


def check_optimizer_update(ctx: Context) -> dict:
    model = copy.deepcopy(ctx.model)
    model.train()
    train = ctx.params.train
    try:
        optimizer = make_adamw(model, train.lr, train.weight_decay, train.betas)
    except ValueError as exc:
        ctx.summary["param_update_max"] = 0.0
        raise CheckFailed(str(exc), {"max_change": 0.0}) from None
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    ctx.seed_all(4)
    _, loss = model(*ctx.batch)
    loss.backward()
    optimizer.step()
    changes = {n: float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters() if n in before}
    unchanged = [n for n, c in changes.items() if c == 0.0]
    max_change = max(changes.values())
    ctx.summary["param_update_max"] = max_change
    measured = {"lr": train.lr, "max_change": max_change, "unchanged": unchanged}
    if max_change == 0.0:
        raise CheckFailed("one AdamW step changed no parameter", measured)
    if unchanged:
        raise CheckFailed(f"one AdamW step left {', '.join(unchanged)} unchanged", measured)
    return measured


def _train_steps(model: nn.Module, optimizer, ctx: Context, steps: int, batch_fn, grad_clip: float | None,
                 lr_at: Callable[[int], float] | None = None):
    """Plain training steps (at lr_at(step) when given); returns (losses, failure text or None). Stops at the first
    non-finite value."""
    losses = []
    with NonFiniteTracker(model) as tracker:
        for step in range(steps):
            if lr_at is not None:
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(step)
            inputs, targets = batch_fn(step)
            tracker.reset()
            _, loss = model(inputs, targets)
            value = float(loss.detach())
            if not math.isfinite(value):
                return losses, f"loss became {value} at step {step} (last finite step {step - 1}); first non-finite module: '{tracker.first}'"
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip is not None:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                if not torch.isfinite(norm):
                    return losses + [value], f"gradient norm became {float(norm)} at step {step}"
            optimizer.step()
            losses.append(value)
    return losses, None


def lr_stability_warmup(ctx: Context) -> int:
    return min(ctx.params.train.warmup_steps, ctx.params.preflight.lr_stability_steps)


def check_lr_stability(ctx: Context) -> dict:
    train, pre = ctx.params.train, ctx.params.preflight
    ctx.seed_all(5)
    model = ctx.model_factory(ctx.model_config).to(ctx.device)
    model.train()
    optimizer = make_adamw(model, train.lr, train.weight_decay, train.betas)
    gen = ctx.generator(5)
    block = ctx.model_config.block_size

    # preflight.batch_size, not train.batch_size: a smaller batch has noisier gradients, so it is the stricter
    # test of the LR, and it keeps the check to seconds for the production model
    def batch_fn(_step):
        return batching.get_batch(ctx.splits["train"], pre.batch_size, block, ctx.device, gen)

    # the run's own linear warmup first (at most lr_stability_steps long, so never gentler than the run's): without
    # it, AdamW's first full-size steps from a fresh init spike the loss once for LRs that train well after warmup
    warmup = lr_stability_warmup(ctx)
    losses, failure = _train_steps(model, optimizer, ctx, warmup + pre.lr_stability_steps, batch_fn, train.grad_clip,
                                   lambda step: train.lr * min(1.0, (step + 1) / warmup) if warmup else train.lr)
    measured = {"lr": train.lr, "warmup_steps": warmup, "steps_at_peak": pre.lr_stability_steps,
                "batch_size": pre.batch_size, "losses": [round(v, 4) for v in losses]}
    if failure:
        raise CheckFailed(failure, measured)
    start = losses[0]
    end = sum(losses[-3:]) / len(losses[-3:])
    peak_step = max(range(len(losses)), key=losses.__getitem__)
    measured.update(start_loss=start, end_loss=end, max_loss=losses[peak_step], max_loss_step=peak_step)
    if losses[peak_step] > start + pre.lr_spike_tolerance:
        raise CheckFailed(
            f"at the peak LR {train.lr} the loss spiked from {start:.4f} to {losses[peak_step]:.4f} at step "
            f"{peak_step} (tolerance +{pre.lr_spike_tolerance}): the learning rate is too high for this model",
            measured,
        )
    if end > start:
        raise CheckFailed(
            f"at the peak LR {train.lr} the loss climbed from {start:.4f} to {end:.4f} (mean of last 3) in "
            f"{len(losses)} steps: the learning rate is too high for this model",
            measured,
        )
    return measured


def overfit_run(ctx: Context, dropout: float) -> dict:
    pre = ctx.params.preflight
    config = MiniGPTConfig(vocab_size=ctx.model_config.vocab_size, **{**DEBUG_MODEL, "dropout": dropout})
    ctx.seed_all(6)
    model = ctx.model_factory(config).to(ctx.device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=pre.overfit_lr, weight_decay=0.0)
    batch = batching.get_batch(ctx.splits["train"], pre.overfit_batch_size, config.block_size, ctx.device, ctx.generator(6))
    losses, failure = _train_steps(model, optimizer, ctx, pre.overfit_steps, lambda _s: batch, None)
    model.eval()
    with torch.no_grad():
        _, final = model(*batch)
    reached = next((i for i, v in enumerate(losses) if v < pre.overfit_threshold), None)
    return {"dropout": dropout, "final_loss": float(final), "steps_to_threshold": reached,
            "loss_at": {str(i): round(losses[i], 4) for i in range(0, len(losses), max(1, len(losses) // 5))},
            "failure": failure}


def check_single_batch_overfit(ctx: Context) -> dict:
    pre = ctx.params.preflight
    main = overfit_run(ctx, 0.0)
    with_dropout = overfit_run(ctx, 0.2)
    ctx.summary["single_batch_final_loss"] = main["final_loss"]
    measured = {"batch": [pre.overfit_batch_size, DEBUG_MODEL["block_size"]], "steps": pre.overfit_steps,
                "lr": pre.overfit_lr, "dropout_0.0": main, "dropout_0.2": with_dropout}
    if main["failure"]:
        raise CheckFailed(main["failure"], measured)
    if not main["final_loss"] < pre.overfit_threshold:
        raise CheckFailed(
            f"a fresh debug model could not memorise one batch: final loss {main['final_loss']:.4f} after "
            f"{pre.overfit_steps} steps (threshold {pre.overfit_threshold})",
            measured,
        )
    return measured


CHECKS: tuple[Check, ...] = (
    Check("environment", check_environment, (), "informational", ()),
    Check("files", check_files, (), "every required artifact exists, is non-empty and matches meta.json",
          ("a stage did not run or was interrupted: run `dvc repro encode`", "an artifact was edited or replaced by hand")),
    Check("tokenizer", check_tokenizer, ("files",),
          lambda c: f"decode/re-encode of the first {c.params.preflight.tokenizer_chars} train IDs is exact and equals clean train text",
          ("tokenizer file swapped or rebuilt after encode (different character order)",
           "encode ran with a different tokenizer: rerun `dvc repro encode`", "clean text changed after encoding")),
    Check("token_ids", check_token_ids, ("files",), lambda c: f"0 <= id < vocab_size ({c.tokenizer.vocab_size}) in every split",
          ("data encoded with a different, larger vocabulary", "off-by-one: an ID equal to vocab_size",
           "IDs overflowed a too-small dtype")),
    Check("batch_shift", check_batch_shift, ("token_ids",),
          "inputs, targets: same shape [B, T], torch.long, on the model's device; inputs[:, 1:] == targets[:, :-1]",
          ("targets not shifted (inputs == targets: the model learns to copy)", "shifted the wrong way or by more than one",
           "batch left on the CPU while the model is on the accelerator", "IDs cast to float")),
    Check("forward_shapes", check_forward_shapes, ("batch_shift",), "logits [B, T, V]; loss a finite scalar",
          ("wrong reshape/transpose in attention", "head sized for another vocabulary", "NaN from a bad init or mask")),
    Check("initial_loss", check_initial_loss, ("forward_shapes",),
          lambda c: f"|loss - log(V)| <= {c.params.preflight.initial_loss_tolerance} nats",
          ("above: extreme initial logits (init too large), targets not matching inputs, loss on wrong IDs",
           "below: future tokens visible (causal mask), unshifted targets, loaded weights instead of a fresh init")),
    Check("causal_independence", check_causal_independence, ("forward_shapes",),
          f"prefix logits unchanged by a new suffix (atol {CAUSAL_ATOL}); d logits[t] / d emb[t' > t] <= {CAUSAL_GRAD_ATOL}",
          ("attention without causal masking (is_causal / mask missing)", "mask built the wrong way round or offset by one",
           "a layer mixing positions (e.g. normalisation over time)")),
    Check("gradients", check_gradients, ("forward_shapes",),
          "every trainable parameter gets a finite, non-zero gradient",
          ("a layer defined but not used in forward", "parameters frozen (requires_grad=False)",
           "a tensor detached from the graph (.detach(), .item(), numpy round trip)", "NaN/Inf from an overflow")),
    Check("optimizer_update", check_optimizer_update, ("forward_shapes",),
          "one AdamW step with a fresh optimizer changes every trainable parameter",
          ("all parameters frozen", "optimizer built over the wrong parameter list", "learning rate 0",
           "zero_grad called between backward and step")),
    Check("lr_stability", check_lr_stability, ("forward_shapes", "optimizer_update"),
          lambda c: (f"{lr_stability_warmup(c)} warmup steps, then {c.params.preflight.lr_stability_steps} at peak lr "
                     f"{c.params.train.lr}: finite, no loss above the first + {c.params.preflight.lr_spike_tolerance}, "
                     "mean of the last 3 <= the first"),
          ("learning rate too high for this model/batch", "no gradient clipping", "warmup needed (instability starts at the peak LR)")),
    Check("single_batch_overfit", check_single_batch_overfit, ("forward_shapes", "optimizer_update", "causal_independence"),
          lambda c: f"fresh debug model, one batch, {c.params.preflight.overfit_steps} steps: final loss < {c.params.preflight.overfit_threshold}",
          ("the model cannot learn: broken residuals, wrong targets, or a bug in the loss", "learning rate far too low or too high",
           "data pipeline feeding different batches each step")),
)


def run_checks(ctx: Context, checks: tuple[Check, ...] = CHECKS, only: set[str] | None = None) -> list[CheckResult]:
    results: dict[str, CheckResult] = {}
    for check in checks:
        if only is not None and check.name not in only:
            continue
        blocked = [n for n in check.needs if n in results and results[n].status != "passed"]
        blocked += [n for n in check.needs if n not in results and (only is None or n in only)]
        start = time.perf_counter()
        if blocked:
            reason = ", ".join(f"{n} {results[n].status if n in results else 'not run'}" for n in blocked)
            result = CheckResult(check.name, "skipped", {}, _safe_threshold(check, ctx), 0.0, f"skipped: needs {reason}")
        else:
            try:
                measured = check.run(ctx)
                result = CheckResult(check.name, "passed", measured, _safe_threshold(check, ctx), time.perf_counter() - start)
            except CheckFailed as exc:
                result = CheckResult(check.name, "failed", exc.measured, _safe_threshold(check, ctx),
                                     time.perf_counter() - start, str(exc), list(check.likely_causes))
        results[check.name] = result
    return list(results.values())


def _safe_threshold(check: Check, ctx: Context) -> str:
    try:
        return check.threshold_text(ctx)
    except Exception:  # noqa: BLE001 - a threshold that needs an artifact that failed to load
        return "(needs an earlier check)"


def format_table(checks: list[dict]) -> str:
    """The console summary of a report's checks (CheckResult.to_dict() rows)."""
    rows = [f"{'check':<22} {'status':<8} {'seconds':>8}  detail"]
    for c in checks:
        rows.append(f"{c['name']:<22} {c['status'].upper():<8} {c['seconds']:>8.3f}  {c.get('message', '')}")
        if c["status"] == "failed":
            rows.append(f"{'':<22} threshold: {c['threshold']}")
            rows.extend(f"{'':<22} likely cause: {cause}" for cause in c.get("likely_causes", []))
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------ report and gate

# train.* keys whose value changes what preflight proves (the gate refuses a report made with other values)
GATED_TRAIN_KEYS = ("lr", "warmup_steps", "weight_decay", "betas", "grad_clip", "device")
SUMMARY_FIELDS = ("tokenizer_fingerprint", "vocab_size", "token_range", "batch_shape", "initial_loss",
                  "expected_initial_loss", "grad_norm", "missing_gradients", "param_update_max", "single_batch_final_loss")


class PreflightFailed(MinigptError):
    """A preflight check failed: the report was written and names it."""


class GateError(MinigptError):
    """Training refused: the debug report is missing, failed, edited, or made for other data/config."""


def gated_config(params: Params) -> dict:
    return {
        "model": params.section_dict("model"),
        "train": {k: params.section_dict("train")[k] for k in GATED_TRAIN_KEYS},
        "preflight": params.section_dict("preflight"),
    }


def current_fingerprints(params: Params, root: Path = Path(".")) -> dict:
    """What a report is bound to: the encoded arrays' SHA-256, the tokenizer fingerprint, the gated config."""
    encoded = {}
    for split in SPLITS:
        path = root / ENCODED_DIR / f"{split}.npy"
        encoded[split] = sha256_file(path) if path.is_file() else None
    try:
        tokenizer = CharTokenizer.load(root / TOKENIZER_FILE).fingerprint
    except MinigptError:
        tokenizer = None
    return {"encoded": encoded, "tokenizer": tokenizer, "config": canonical_json_digest(gated_config(params))}


def build_report(ctx: Context, results: list[CheckResult], fingerprints: dict) -> dict:
    env = next((r.measured for r in results if r.name == "environment"), {})
    total = sum(r.seconds for r in results)
    report = {
        "passed": all(r.status == "passed" for r in results),
        "failed": [r.name for r in results if r.status == "failed"],
        "skipped": [r.name for r in results if r.status == "skipped"],
        "checks": [r.to_dict() for r in results],
        **{name: ctx.summary.get(name) for name in SUMMARY_FIELDS},
        "environment": env,
        "seconds": {"total": round(total, 3),
                    "without_overfit": round(total - sum(r.seconds for r in results if r.name == "single_batch_overfit"), 3)},
        "config": gated_config(ctx.params),
        "fingerprints": fingerprints,
    }
    report["report_digest"] = canonical_json_digest(report)
    return report


def run_preflight(params: Params, root: Path = Path("."), report_path: Path | None = None, **context_overrides) -> dict:
    """Run every check on the real artifacts under root, write the report atomically, return it."""
    device = select_device(params.train.device)
    tokenizer_vocab = None
    try:
        tokenizer_vocab = CharTokenizer.load(root / TOKENIZER_FILE).vocab_size
    except MinigptError:
        pass
    model_config = MiniGPTConfig.from_params(params.model, tokenizer_vocab or 1)
    ctx = Context(params=params, root=root, device=device, model_config=model_config, **context_overrides)
    torch.manual_seed(params.preflight.seed)
    results = run_checks(ctx)
    report = build_report(ctx, results, current_fingerprints(params, root))
    atomic_write_json(report_path or root / DEBUG_REPORT, report)
    return report


def verify_gate(params: Params, root: Path = Path("."), report_path: Path | None = None) -> dict:
    """Refuse training unless the report passed and is bound to exactly the current data and configuration."""
    path = report_path or root / DEBUG_REPORT
    refresh = "Run `dvc repro preflight` (or `python stages/preflight.py`) to refresh it."
    report = read_json(path, missing="no debug report; training starts only after preflight passes",
                       invalid="unreadable debug report", fix=refresh, error=GateError)
    body = {k: v for k, v in report.items() if k != "report_digest"}
    if report.get("report_digest") != canonical_json_digest(body):
        raise GateError(f"{path}: the report does not match its digest: it was edited by hand. {refresh}")
    if not report.get("passed"):
        raise GateError(f"{path}: preflight failed ({', '.join(report.get('failed') or ['?'])}); fix that, then rerun preflight. {refresh}")
    now = current_fingerprints(params, root)
    then = report.get("fingerprints", {})
    stale = [f"encoded {s}" for s in SPLITS if then.get("encoded", {}).get(s) != now["encoded"][s]]
    if then.get("tokenizer") != now["tokenizer"]:
        stale.append("tokenizer")
    if then.get("config") != now["config"]:
        old = report.get("config", {})
        new = gated_config(params)
        changed = [f"{sec}.{k}" for sec in new for k in new[sec] if old.get(sec, {}).get(k) != new[sec][k]]
        stale.append("config (" + (", ".join(changed) or "changed") + ")")
    if stale:
        raise GateError(f"{path}: the report was made for other inputs; mismatched fingerprint: {'; '.join(stale)}. {refresh}")
    return report
