"""A per-step ledger of an engine-alone run: each step's own floor next to its measured time,
and where the time above the workload floor goes, by kind of step.

A step's floor is the workload floor's cost model (`serving_workloads.floor`) applied to
that one step: its prompt tokens' FLOPs at the measured matmul rate plus the bytes it must
read (every weight once, each decoding sequence's earlier KV) at the measured copy rate;
`roofline` is the larger of the two instead of their sum, with the decodes' FLOPs counted
too (a device that overlaps compute and memory). Summed over a run, the step floors equal
the workload floor when the run took the floor's number of steps (same prompt FLOPs, same
KV reads: see `test_step_ledger`), so

    measured = workload floor
             + (steps taken - floor's steps) x one weight pass     ("extra steps")
             + sum over steps of (device time - step floor)         (excess, by class)
             + GPU idle between steps                                ("host gaps")

Classes: pure decode steps by batch band, mixed steps (any prompt tokens) by how they ran
(piecewise graphs, or eagerly past `--piecewise-max-tokens`), and the gaps.

A step record (`step_profile.StepProfile`) holds: `decodes` (sequences sampling an output
token from an earlier one), `prefill_tokens`, `prompts_ended` (prompts whose last chunk is
in the step: one LM-head row each), `kv_context` (earlier positions the decodes read),
`attn_pairs` (the prompt chunks' causal (query, key) pairs), `mode` ("graph", "pieces",
"eager"; "none" for a step that ran nothing), `device` (seconds the GPU spent from the
step's first command to its last, idle stretches inside the step included), `gap` (seconds
the GPU sat idle before the step's first command) and `wall` (the host's time in
`core.step()`).
"""

from __future__ import annotations

from serving_workloads import _shape

DECODE_BANDS = (8, 32, 128, 255)  # decode batch bands: 1-8, 9-32, 33-128, 129-255, 256+


def step_floor(rec: dict, shape: dict, rates: dict) -> dict:
    """The step's floor on the workload floor's model (`additive`), its roofline bound, and
    the two parts (seconds)."""
    params, head = shape["params"], shape["head"]
    prefill_flops = (
        2 * (params - head) * rec["prefill_tokens"]
        + 2 * head * rec["prompts_ended"]
        + shape["attn_flops_per_pair"] * rec["attn_pairs"]
    )
    decode_flops = 2 * params * rec["decodes"] + shape["attn_flops_per_pair"] * (
        rec["kv_context"] + rec["decodes"]
    )
    memory_s = (shape["weight_bytes"] + shape["kv_bytes_per_token"] * rec["kv_context"]) / rates[
        "copy_bytes_s"
    ]
    compute_s = prefill_flops / rates["matmul_flops"]
    return {
        "compute_s": compute_s,
        "memory_s": memory_s,
        "additive": compute_s + memory_s,
        "roofline": max((prefill_flops + decode_flops) / rates["matmul_flops"], memory_s),
    }


def step_class(rec: dict) -> str | None:
    """The ledger class of a step; None for a step that ran nothing (a last read-back)."""
    if rec["mode"] == "none" or not (rec["decodes"] or rec["prefill_tokens"]):
        return None
    if rec["prefill_tokens"]:
        return f"mixed {rec['mode']}"
    low = 1
    for high in DECODE_BANDS:
        if rec["decodes"] <= high:
            band = f"decode {low}-{high}"
            break
        low = high + 1
    else:
        band = f"decode {low}+"
    return band if rec["mode"] == "graph" else f"{band} {rec['mode']}"


STALL_RATIO, STALL_S = 3.0, 0.05  # a stall: device time over 3x the step's floor + 50 ms


def is_stall(row: dict) -> bool:
    """A step whose device time is over STALL_RATIO times its floor plus STALL_S: no
    step's work explains that much (the host stopped inside it)."""
    return row["device"] > STALL_RATIO * row["floor"] + STALL_S


def ledger(records: list[dict], cfg: dict, rates: dict, workload_floor: dict | None = None) -> dict:
    """Each step's floor and excess (`rows`, in the records' order), the excess summed by
    class, and the run's totals. `workload_floor`: `serving_workloads.floor`'s result for
    the run's lengths, to split the gap to it into extra steps, excess and host gaps."""
    shape = _shape(cfg)
    rows = []
    classes: dict[str, dict] = {}
    for rec in records:
        f = step_floor(rec, shape, rates)
        cls = step_class(rec)
        row = {**rec, "class": cls, "floor": f["additive"], "roofline": f["roofline"]}
        row["excess"] = rec["device"] - f["additive"] if cls else 0.0
        rows.append(row)
        if cls is None:
            continue
        c = classes.setdefault(cls, dict.fromkeys(_SUMMED, 0.0) | {"steps": 0})
        c["steps"] += 1
        for key in _SUMMED:
            c[key] += row[key]
    for c in classes.values():
        n = c["steps"]
        c["excess_ms_per_step"] = 1e3 * c["excess"] / n
        c["device_ms_per_step"] = 1e3 * c["device"] / n
        c["floor_ms_per_step"] = 1e3 * c["floor"] / n
        c["device_over_floor"] = c["device"] / c["floor"] if c["floor"] else 0.0
        for key in ("decodes", "prefill_tokens", "kv_context"):
            c[f"mean_{key}"] = c[key] / n
    ran = [r for r in rows if r["class"] is not None]
    totals = {
        "steps": len(ran),
        "device_s": sum(r["device"] for r in ran),
        "gaps_s": sum(r["gap"] for r in rows),
        "wall_s": sum(r["wall"] for r in rows),
        "step_floors_s": sum(r["floor"] for r in ran),
        "step_rooflines_s": sum(r["roofline"] for r in ran),
        "excess_s": sum(r["excess"] for r in ran),
        # The host in Python's cyclic collector (inside the steps' wall and device times).
        "gc_s": sum(r.get("gc", 0.0) for r in rows),
        "gc_full": sum(r.get("gc_full", 0) for r in rows),
        "slowest_steps_ms": sorted((round(1e3 * r["device"], 1) for r in ran), reverse=True)[:5],
        # Steps far over their floor (a collection, a first-use load): counted in their
        # class too, and summed here so a class's excess can be read without them.
        "stalls": sum(is_stall(r) for r in ran),
        "stall_excess_s": sum(r["excess"] for r in ran if is_stall(r)),
        # The CUDA allocator's work read after slow steps (`step_profile.SLOW_STEP_S`).
        "cuda_mallocs": sum(r.get("cuda_mallocs", 0) for r in rows),
        "alloc_retries": sum(r.get("alloc_retries", 0) for r in rows),
    }
    if workload_floor is not None:
        totals["workload_floor_s"] = workload_floor["seconds"]
        totals["floor_steps"] = workload_floor["steps"]
        # Each step past the floor's count costs one weight pass in the step floors' sum.
        totals["extra_steps_s"] = totals["step_floors_s"] - workload_floor["seconds"]
    order = sorted(classes, key=lambda k: -classes[k]["excess"])
    return {"classes": {k: classes[k] for k in order}, "totals": totals, "rows": rows}


_SUMMED = (
    "device",
    "wall",
    "gap",
    "floor",
    "roofline",
    "excess",
    "decodes",
    "prefill_tokens",
    "kv_context",
)


def format_ledger(led: dict) -> str:
    """The class table and the totals as markdown (what the README's History takes)."""
    t = led["totals"]
    lines = [
        "| class | steps | device s | floor s | excess s | excess ms/step | device / floor "
        "| mean decodes | mean prompt tokens | mean KV context | host wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in led["classes"].items():
        lines.append(
            f"| {name} | {c['steps']} | {c['device']:.2f} | {c['floor']:.2f} | "
            f"{c['excess']:.2f} | {c['excess_ms_per_step']:.2f} | {c['device_over_floor']:.2f} "
            f"| {c['mean_decodes']:.0f} | {c['mean_prefill_tokens']:.0f} | "
            f"{c['mean_kv_context']:.0f} | {c['wall']:.2f} |"
        )
    lines.append(f"| host gaps (GPU idle between steps) | | {t['gaps_s']:.2f} | | | | | | | | |")
    text = "\n".join(lines)
    text += (
        f"\nsteps {t['steps']}, device {t['device_s']:.2f} s + gaps {t['gaps_s']:.2f} s "
        f"(host wall {t['wall_s']:.2f} s); step floors {t['step_floors_s']:.2f} s (rooflines "
        f"{t['step_rooflines_s']:.2f}); excess {t['excess_s']:.2f} s; garbage collection "
        f"{t['gc_s']:.2f} s ({t['gc_full']} full); {t['stalls']} stalls (over {STALL_RATIO:g}x "
        f"their floor + {1e3 * STALL_S:.0f} ms) {t['stall_excess_s']:.2f} s of the excess; "
        f"after slow steps {t['cuda_mallocs']} cudaMalloc, {t['alloc_retries']} allocator "
        "retries; "
        f"slowest steps {t['slowest_steps_ms']} ms"
    )
    if "workload_floor_s" in t:
        text += (
            f"; workload floor {t['workload_floor_s']:.2f} s ({t['floor_steps']} steps), "
            f"extra steps {t['extra_steps_s']:.2f} s"
        )
    return text
