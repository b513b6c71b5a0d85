"""Each preflight check's measurements as a person checks them: decoded text beside the clean text, the input and
target rows of a batch, numbers with their units. Read from the report's JSON (`measured`), so the page shows the
same evidence for a passed and a failed check; a check without a formatter shows its scalar measurements."""

from __future__ import annotations

from typing import Callable

Lines = list[tuple[str, str]]


def _num(value, digits: int = 4, unit: str = "") -> str:
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "–"}[value]
    if isinstance(value, float):
        text = f"{value:.{digits}g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.{digits}f}"
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = str(value)
    return f"{text} {unit}".rstrip()


def _environment(m: dict) -> Lines:
    return [("runtime", f"Python {m.get('python')}, torch {m.get('torch')}, numpy {m.get('numpy')}"),
            ("device", f"{m.get('device')} ({_num(m.get('threads'))} threads; CUDA {_num(m.get('cuda_available'))})")]


def _files(m: dict) -> Lines:
    sizes = m.get("sizes") or {}
    return [(name, _num(size, unit="bytes")) for name, size in sizes.items()]


def _tokenizer(m: dict) -> Lines:
    unit = "byte-level BPE tokens" if m.get("kind") == "bpe" else "characters"
    lines = [("vocabulary", f"{_num(m.get('vocab_size'))} {unit}: first {''.join(m.get('first_chars') or [])!r}, "
                            f"last {''.join(m.get('last_chars') or [])!r}")]
    for split, s in (m.get("splits") or {}).items():
        lines.append((f"{split} decoded", repr(s.get("decoded_start", ""))))
        lines.append((f"{split} clean text", repr(s.get("clean_start", ""))))
        lines.append((f"{split} whole split", f"{_num(s.get('chars_checked'))} IDs decode to the clean text: "
                                              f"{_num(s.get('matches_clean_text'))}; re-encode equal: "
                                              f"{_num(s.get('round_trip_equal'))}"))
    return lines


def _token_ids(m: dict) -> Lines:
    return [(split, f"IDs {_num(s.get('min'))} … {_num(s.get('max'))} of [0, {_num(m.get('vocab_size', 0) - 1)}], "
                    f"{_num(s.get('length'))} tokens ({s.get('dtype')}); at least {_num(m.get('min_split_length'))} "
                    "needed")
            for split, s in (m.get("splits") or {}).items()]


def _batch_shift(m: dict) -> Lines:
    return [("input row 0", repr(m.get("decoded_input", ""))), ("target row 0", repr(m.get("decoded_target", ""))),
            ("shapes",
             f"inputs {m.get('inputs_shape')}, targets {m.get('targets_shape')} ({', '.join(m.get('dtypes') or [])}); "
                       f"targets = inputs shifted by one: {_num(m.get('shift_ok'))}")]


def _forward_shapes(m: dict) -> Lines:
    return [("logits",
             f"{m.get('logits_shape')} (expected {m.get('expected_shape')}); loss shape {m.get('loss_shape')}")]


def _initial_loss(m: dict) -> Lines:
    return [("initial loss", f"{_num(m.get('initial_loss'))} nats against log V = {_num(m.get('expected_log_v'))} nats "
                             f"(difference {_num(m.get('difference'))} nats)")]


def _causal(m: dict) -> Lines:
    return [("prefix logits", f"changed by at most {_num(m.get('prefix_max_abs_diff'))} when the suffix after position "
                              f"{_num(m.get('position'))} changes"),
            ("gradients",
             f"d logits / d future embeddings {_num(m.get('future_grad_max'))}; past {_num(m.get('past_grad_max'))}")]


def _gradients(m: dict) -> Lines:
    return [("gradient norm", f"{_num(m.get('global_norm'))} (global, {m.get('precision')}) over "
                              f"{_num(m.get('trainable'))} trainable tensors, {_num(m.get('frozen'))} frozen"),
            ("without a gradient", ", ".join(m.get("missing") or []) or "none")]


def _optimizer_update(m: dict) -> Lines:
    return [("one step", f"at lr {_num(m.get('lr'))}: loss {_num(m.get('loss'))} nats, gradient norm "
                         f"{_num(m.get('grad_norm'))}, largest parameter change {_num(m.get('max_change'))}"),
            ("unchanged", ", ".join(m.get("unchanged") or []) or "none")]


def _decay_split(m: dict) -> Lines:
    decayed, kept = m.get("decayed") or [], m.get("not_decayed") or []
    lines = [("decayed",
              f"{len(decayed)} tensors at weight_decay {_num(m.get('weight_decay'))}: {', '.join(decayed[:4])}"
                         f"{' …' if len(decayed) > 4 else ''}"),
             ("not decayed", f"{len(kept)} tensors: {', '.join(kept[:4])}{' …' if len(kept) > 4 else ''}")]
    if m.get("optimizer") == "muon":
        muon = m.get("muon") or []
        lines.append(("Muon", f"{len(muon)} hidden matrices: {', '.join(muon[:4])}{' …' if len(muon) > 4 else ''}; "
                              "every other tensor with AdamW"))
    return lines


def _weight_average(m: dict) -> Lines:
    if m.get("ema_decay") is None:
        return [("moving average", "off (train.ema_decay null): the run keeps its trained weights")]
    return [("moving average", f"decay {_num(m.get('ema_decay'))} over {_num(m.get('tensors'))} tensors of its own"),
            ("against its formula", f"after {_num(m.get('updates'))} updates at most "
                                    f"{_num(m.get('max_abs_difference'))} from the float64 specification")]


def _resume(m: dict) -> Lines:
    parts = m.get("parts") or {}
    differ = [part for part, verdict in parts.items() if verdict != "equal"]
    return [("interrupted", f"after step {_num(m.get('stopped_after'))} of {_num(m.get('steps'))}, resumed into "
                            f"fresh objects (batch {_num(m.get('batch_size'))})"),
            ("against the uninterrupted run", f"{len(parts) - len(differ)} of {len(parts)} parts equal bit for bit"
                                              + (f"; differ: {', '.join(differ)}" if differ else "")),
            ("restore verified", str(m.get("verified") or "no"))]


def _watchdogs_fire(m: dict) -> Lines:
    fired = m.get("fired") or {}
    silent = [name for name, names in fired.items() if name not in names]
    off = m.get("off_by_configuration") or []
    return [("on readings that break one rule", f"{len(fired) - len(silent)} of {len(fired)} watchdogs fired by name"
                                                 + (f"; silent: {', '.join(silent)}" if silent else "")),
            ("on healthy readings", ", ".join(m.get("fired_on_healthy") or []) or "none fired"),
            ("off by configuration", ", ".join(off) or "none")]


def _architecture(m: dict) -> Lines:
    counts, expected = m.get("parameters") or {}, m.get("expected_parameters") or {}
    options = m.get("options") or {}
    errors = m.get("activation_max_abs_error")
    return [("options", ", ".join(f"{k} {v}" for k, v in options.items())),
            ("parameters",
             "; ".join(f"{part} {counts.get(part, 0):,} (config: {n:,})" for part, n in expected.items())),
            ("activation", "not probed" if errors is None else
             f"largest error against {options.get('mlp')} {_num(max(errors) if errors else None)} over {len(errors)} "
             "block(s)")] + _dropout_lines(m.get("dropout"))


def _dropout_lines(layers: list[dict] | None) -> Lines:
    if not layers:
        return []
    shares, means = [d["dropped_share"] for d in layers], [d["mean"] for d in layers]
    return [("dropout", f"{len(layers)} layers: dropped {_num(min(shares))}–{_num(max(shares))} of a probe of ones, "
                        f"mean kept {_num(min(means))}–{_num(max(means))}; identity in eval: "
                        f"{sum(d['identity_in_eval'] for d in layers)} of {len(layers)}")]


def _lr_schedule(m: dict) -> Lines:
    at = ", ".join(f"step {step}: {_num(lr)}" for step, lr in (m.get("lr_at") or {}).items())
    lines = [("schedule",
              f"{_num(m.get('steps'))} steps, warmup {_num(m.get('warmup_steps'))}, peak {_num(m.get('peak'))}, "
                          f"min_lr {_num(m.get('min_lr'))}"), ("LR at", at)]
    if m.get("max_seconds"):
        lines.append(("on the clock", f"{_num(m.get('time_fractions'))} shares of {_num(m.get('max_seconds'))} s at "
                                      f"{_num(m.get('steps_on_the_clock'))} steps"))
    return lines


def _clipping(m: dict) -> Lines:
    return [(f"clip at {_num(c.get('grad_clip'))}", f"reported norm {_num(c.get('reported_norm'))} vs the global norm "
                                                    f"before clipping {_num(c.get('reference_norm'))}; the optimizer "
                                                    f"stepped on {_num(c.get('norm_at_step'))}")
            for c in (m.get("at_grad_clip") or {}, m.get("cutting") or {}) if c]


def _lr_stability(m: dict) -> Lines:
    losses = m.get("losses") or []
    return [("rehearsal", f"{_num(m.get('warmup_steps'))} warmup + {_num(m.get('steps_at_peak'))} steps at batch "
                          f"{_num(m.get('batch_size'))}, {m.get('precision')}; LR up to "
                          f"{_num(m.get('max_lr_applied'))}"),
            ("step loss", f"{_num(losses[0] if losses else None)} → {_num(losses[-1] if losses else None)} nats; "
                          f"highest running median {_num(m.get('max_sustained_loss'))} at step "
                          f"{_num(m.get('max_sustained_step'))}"),
            ("fixed batches", f"{_num(m.get('probe_loss_before'))} → {_num(m.get('probe_loss_after'))} nats")]


def _rehearsal_learns(m: dict) -> Lines:
    return [("fixed batches", f"{_num(m.get('probe_loss_before'))} → {_num(m.get('probe_loss_after'))} nats after "
                              f"{_num(m.get('steps'))} steps"),
            ("the bar", f"character frequencies score {_num(m.get('probe_unigram_loss'))} nats on them; must end at or "
                        f"below {_num(m.get('bar'))} (log V = {_num(m.get('log_v'))})")]


def _overfit(m: dict) -> Lines:
    main = m.get("dropout_0.0") or {}
    return [("one batch", f"{m.get('batch')} for {_num(m.get('steps'))} steps at lr {_num(m.get('lr'))}: final loss "
                          f"{_num(main.get('final_loss'))} nats (below the threshold at step "
                          f"{_num(main.get('steps_to_threshold'))})")]


def _unused_or(lines: Callable[[dict], Lines]) -> Callable[[dict], Lines]:
    unused = [("soft targets", "not used (train.distill_alpha 0, model.ngram_expert false)")]
    return lambda m: lines(m) if m.get("used") else unused


@_unused_or
def _soft_targets(m: dict) -> Lines:
    built = (f"{_num(m.get('positions'))} train positions, top {_num(m.get('top'))} tokens of an order "
             f"{_num(m.get('order'))} n-gram, {_num(m.get('folds'))} folds, discount {_num(m.get('discount'))}")
    quality = (f"{_num(m.get('bits_per_token'))} bits/token held out, {_num(m.get('kept_mass'))} of the mass kept; "
               f"rows sum to {_num(m.get('row_sum_min'))} … {_num(m.get('row_sum_max'))}")
    return [("built", built), ("quality", quality)]


@_unused_or
def _soft_targets_held_out(m: dict) -> Lines:
    return [("recounted", f"fold {_num(m.get('fold'))}, {_num(m.get('positions_compared'))} positions: stored and "
                          f"recounted without the fold differ by at most {_num(m.get('max_abs_difference'))}"),
            ("mass on the next token", f"stored {_num(m.get('stored_mass_on_next_token'))}, held out "
                                       f"{_num(m.get('held_out_mass_on_next_token'))}")]


@_unused_or
def _soft_targets_aligned(m: dict) -> Lines:
    return [("soft targets' mass", f"on the targets {_num(m.get('mass_on_targets'))}, on the inputs "
                                   f"{_num(m.get('mass_on_inputs'))}, on the token after each target "
                                   f"{_num(m.get('mass_on_next_target'))}")]


def _expert_unused_or(lines: Callable[[dict], Lines]) -> Callable[[dict], Lines]:
    return lambda m: lines(m) if m.get("used", True) else [("n-gram expert", "not used (model.ngram_expert false)")]


@_expert_unused_or
def _ngram_priors(m: dict) -> Lines:
    return [(split, f"{_num((m.get(split) or {}).get('positions_compared'))} positions: stored and recounted on train "
                    f"differ by at most {_num((m.get(split) or {}).get('max_abs_difference'))}; mass on the targets "
                    f"stored {_num((m.get(split) or {}).get('stored_mass_on_targets'))}, recounted "
                    f"{_num((m.get(split) or {}).get('recounted_mass_on_targets'))}") for split in ("val", "test")]


@_expert_unused_or
def _expert_gate_even(m: dict) -> Lines:
    return [("a new model's mixture", f"differs from half the network and half the n-gram by at most "
                                      f"{_num(m.get('max_abs_difference'))}; sums to {_num(m.get('mixed_sums_to'))}")]


def _scalars(m: dict) -> Lines:
    return [(key, _num(value)) for key, value in m.items() if isinstance(value, (int, float, bool, str))][:8]


FORMATTERS: dict[str, Callable[[dict], Lines]] = {
    "environment": _environment, "files": _files, "tokenizer": _tokenizer, "token_ids": _token_ids,
    "batch_shift": _batch_shift, "soft_targets": _soft_targets, "soft_targets_held_out": _soft_targets_held_out,
    "soft_targets_aligned": _soft_targets_aligned, "ngram_priors": _ngram_priors,
    "expert_gate_even": _expert_gate_even, "forward_shapes": _forward_shapes, "initial_loss": _initial_loss,
    "causal_independence": _causal,
    "architecture": _architecture, "gradients": _gradients, "optimizer_update": _optimizer_update,
    "decay_split": _decay_split,
    "lr_schedule": _lr_schedule, "clipping_contract": _clipping, "weight_average": _weight_average,
    "resume": _resume, "watchdogs_fire": _watchdogs_fire, "lr_stability": _lr_stability,
    "rehearsal_learns": _rehearsal_learns, "single_batch_overfit": _overfit,
}


def evidence(check: dict) -> Lines:
    """(label, text) lines for one check of a report; never raises on a report of another version."""
    measured = check.get("measured") or {}
    try:
        return FORMATTERS.get(check.get("name"), _scalars)(measured)
    except (TypeError, ValueError, AttributeError, KeyError):
        return _scalars(measured)
