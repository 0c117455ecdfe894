"""The table `native_gpu_http_vs_engine.py` prints: each profile's floor, the engine alone
(and its variants), each HTTP variant, with ratios to the engine and to the floor."""

from __future__ import annotations

from step_ledger import format_ledger


def runs_of(results: dict, profile: str) -> list[str]:
    """The keys of an engine's runs of `profile`: the profile, or one per admission order
    (`<profile>_fcfs`, `<profile>_lof`: `--policies`)."""
    return [k for k in results if k == profile or k in (f"{profile}_fcfs", f"{profile}_lof")]


def print_table(res: dict, profiles: list[str], variants: list[str], concurrency: int) -> None:
    rates = res["rates"]
    eng = res.get("engine", {})
    print(
        f"\nmatmul {rates['matmul_flops'] / 1e12:.0f} TFLOP/s, copy "
        f"{rates['copy_bytes_s'] / 1e12:.2f} TB/s; batch-1 decode "
        f"{eng.get('b1_decode_tok_s', 0):.1f} tok/s; decode step at 256: "
        f"{eng.get('step_ms_at_256', 0):.2f} ms"
    )
    engines = {"default": eng, **res.get("engine_variants", {})}
    for name, r in engines.items():
        mixed = {k: v for k, v in r.items() if k.startswith("mixed_step_ms_")}
        if mixed:
            shown = ", ".join(
                f"{k.removeprefix('mixed_step_ms_').replace('_plus_', ' + ')}: {v:.2f} ms"
                for k, v in mixed.items()
            )
            print(f"mixed steps, engine alone {name} (decodes + one new prompt): {shown}")
            busy = {
                k.removeprefix("gpu_busy_"): round(v.get("busy", 0), 2)
                for k, v in r.items()
                if k.startswith("gpu_busy_")
            }
            print(f"  GPU busy over those steps: {busy}")
    print(
        "| profile | setup | output tok/s | / engine | / floor | / old floor | ITL p50 ms "
        "| ITL / step | busiest CPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    step = eng.get("step_ms_at_256")
    for profile in profiles:
        floor = res["floor"][profile]
        fl, old = floor["output_tok_s"], floor["old"]["output_tok_s"]
        print(
            f"| {profile} | floor ({floor['steps']} steps: the longest output "
            f"{floor['longest_output']}, {floor['steps_by_tokens']} by count) | {fl:.0f} | "
            f"| 1.00 | {fl / old:.2f} | | | |"
        )
        print(
            f"| {profile} | old floor ({floor['old']['steps']} steps) | {old:.0f} | | "
            f"{old / fl:.2f} | 1.00 | | | |"
        )
        roof = floor["roofline"]["output_tok_s"]
        print(
            f"| {profile} | roofline (compute and memory overlapped) | {roof:.0f} | | "
            f"{roof / fl:.2f} | {roof / old:.2f} | | | |"
        )
        modes = [
            (f"{profile}", "all at once"),
            (f"{profile}_closed_loop", f"{concurrency} in flight"),
        ]
        runs = [(label, eng[key]) for key, label in modes if key in eng]
        # The reference: the engine alone's better mode.
        e = max((r for _, r in runs), key=lambda r: r["output_tok_s"], default=None)
        for name, v in res.get("engine_variants", {}).items():
            for key in runs_of(v, profile):
                runs.append((f"{name}{key.removeprefix(profile)}, all at once", v[key]))
        e = e or (runs[0][1] if runs else None)  # without the default engine: the first
        for label, r in runs:
            print(
                f"| {profile} | engine alone ({label}) | {r['output_tok_s']:.0f} | "
                f"{r['output_tok_s'] / e['output_tok_s']:.2f} | {r['output_tok_s'] / fl:.2f} "
                f"| {r['output_tok_s'] / old:.2f} | | | {r['cpu_pct']:.0f}% |"
            )
        for name in variants:
            h = res["http"].get(name, {}).get(profile)
            if not h:
                continue
            busiest = max(h["cpu_pct"].items(), key=lambda kv: kv[1], default=("-", 0))
            vs = f"{h['output_tok_s'] / e['output_tok_s']:.2f}" if e else "-"
            itl = h["itl_p50_ms"] or 0
            ratio = f"{itl / step:.2f}" if step else "-"
            print(
                f"| {profile} | HTTP {name} ({h['ok']} ok, {h['failed']} failed) | "
                f"{h['output_tok_s']:.0f} | {vs} | {h['output_tok_s'] / fl:.2f} | "
                f"{h['output_tok_s'] / old:.2f} | {itl:.1f} | "
                f"{ratio} | {busiest[0]} {busiest[1]:.0f}% |"
            )
    print_latencies(res, profiles, variants, step)
    print_steps(res, profiles)


def print_latencies(
    res: dict, profiles: list[str], variants: list[str], step: float | None
) -> None:
    """Each HTTP run's latency percentiles: TPOT (stator bench's ITL, per request), the
    gaps between streamed chunks (vLLM bench's ITL, per token) and TTFT, in ms."""
    print(
        "\n| profile | HTTP variant | tok/s | TPOT p50/p90/p99 | gap p50/p90/p99 | "
        "gap p50 / step | TTFT p50/p90/p99 |"
    )
    print("|---|---|---|---|---|---|---|")
    for profile in profiles:
        for name in variants:
            h = res["http"].get(name, {}).get(profile)
            if not h:
                continue

            def three(key: str, h=h) -> str:
                return " / ".join(
                    f"{h.get(f'{key}_{p}_ms') or 0:.1f}" for p in ("p50", "p90", "p99")
                )

            gap = h.get("gap_p50_ms") or 0
            print(
                f"| {profile} | {name} | {h['output_tok_s']:.0f} | {three('itl')} | {three('gap')} "
                f"| {gap / step if step else 0:.2f} | {three('ttft')} |"
            )


def print_steps(res: dict, profiles: list[str]) -> None:
    """The engine alone's runs step by step (`step_profile.py`)."""
    engines = {"default": res.get("engine", {}), **res.get("engine_variants", {})}
    for name, r in engines.items():
        for profile in (key for p in profiles for key in runs_of(r, p)):
            s = r.get(profile, {}).get("steps")
            if not s:
                continue
            print(
                f"\nengine alone {name}, {profile}: {s['steps']} steps, {s['seconds']:.1f} s, "
                f"host waiting on the device {100 * s['device_wait_share']:.0f}% of it; "
                f"threads: {r[profile].get('threads_cpu_pct')}"
            )
            if "ledger" in r[profile]:
                print(format_ledger(r[profile]["ledger"]))
            print(
                "| steps | count | s | ms/step (p50, max) | device wait ms | seqs | tokens "
                "| tok/s out |"
            )
            print("|---|---|---|---|---|---|---|---|")
            groups = {**s["by_kind"], **{f"batch {k}": v for k, v in s["by_batch"].items()}}
            groups["tail (queue empty)"] = s["tail_after_queue_empty"]
            for label, g in groups.items():
                print(
                    f"| {label} | {g['steps']} | {g['seconds']:.2f} | {g['ms_per_step']:.2f} "
                    f"({g.get('ms_p50', 0):.1f}, {g.get('ms_max', 0):.0f}) | "
                    f"{g['device_wait_ms']:.2f} | {g['mean_seqs']} | {g['mean_tokens']} | "
                    f"{g['emitted_per_s']} |"
                )
