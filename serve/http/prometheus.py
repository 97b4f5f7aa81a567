"""Counters and histograms in the Prometheus text exposition format (version 0.0.4)."""

from __future__ import annotations

from typing import Sequence


def histogram(name: str, help_text: str, h) -> list[str]:
    """A runtime Histogram (runtime/scheduling/histogram.py) as cumulative buckets."""
    buckets, counts, total = h.snapshot()
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    running = 0
    for bound, n in zip(buckets, counts):
        running += n
        out.append(f'{name}_bucket{{le="{bound:g}"}} {running}')
    running += counts[-1]
    out += [f'{name}_bucket{{le="+Inf"}} {running}', f"{name}_sum {total:.6f}", f"{name}_count {running}"]
    return out


def counter(name: str, help_text: str, value: float, labels: dict[str, str] | None = None) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name}{_labels(labels)} {value:g}"]


def counter_family(name: str, help_text: str, samples: Sequence[tuple[dict[str, str], float]]) -> list[str]:
    """One counter with a sample per set of labels."""
    return [f"# HELP {name} {help_text}", f"# TYPE {name} counter",
            *(f"{name}{_labels(labels)} {value:g}" for labels, value in samples)]


def gauge(name: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value:g}"]


def _labels(labels: dict[str, str] | None) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def scheduler_metrics(sched) -> str:
    """The /metrics page for a Scheduler."""
    st = sched.stats
    lines: list[str] = ["# HELP tallow_requests_total Requests finished, by finish reason",
                        "# TYPE tallow_requests_total counter"]
    for reason, n in sorted(dict(st.requests).items()):
        lines.append(f'tallow_requests_total{{finish_reason="{_escape(reason)}"}} {n}')
    lines += counter("tallow_prompt_tokens_total", "Prompt tokens of finished requests", st.prompt_tokens)
    lines += counter("tallow_cached_prompt_tokens_total", "Prompt tokens reused from the KV cache", st.cached_tokens)
    lines += counter("tallow_completion_tokens_total", "Tokens generated", st.completion_tokens)
    lines += counter("tallow_decode_calls_total", "llama_decode calls made", st.steps)
    lines += counter("tallow_draft_tokens_total", "Drafted tokens verified (speculative decoding)", st.draft_tokens)
    lines += counter("tallow_draft_accepted_tokens_total", "Drafted tokens the model confirmed", st.accepted_tokens)
    lines += counter("tallow_draft_steps_total", "Decode steps that verified a draft (tokens / steps: the mean draft length)",
                     st.draft_steps)
    lines += counter("tallow_requests_rejected_total", "Requests refused with 503: the queue was full", st.rejected)
    lines += histogram("tallow_time_to_first_token_seconds", "From submission to the first token", st.ttft)
    lines += histogram("tallow_inter_token_latency_seconds", "Between consecutive tokens of a request", st.itl)
    lines += gauge("tallow_queue_depth", "Requests waiting for a slot", sched.queue_depth)
    lines += gauge("tallow_slots_busy", "Slots decoding a request", sched.busy_slots)
    lines += gauge("tallow_slots_total", "Slots (sequences decoded together)", len(sched.slots))
    lines += gauge("tallow_kv_cells_used", "KV cache cells holding tokens", sched.kv_used)
    lines += gauge("tallow_kv_cells_total", "KV cache cells", sched.n_ctx)
    return "\n".join(lines) + "\n"


def merge_pages(pages: dict[str, str]) -> str:
    """Several runners' /metrics pages as one: every sample gets a `model` label, and each
    family's HELP and TYPE lines appear once, before its samples."""
    families: dict[str, list[str]] = {}
    heads: dict[str, list[str]] = {}
    for model, page in sorted(pages.items()):
        family = ""
        for line in page.splitlines():
            if line.startswith("# "):
                parts = line.split(" ", 3)
                family = parts[2] if len(parts) > 2 else family
                if family not in heads:
                    heads[family] = []
                if line not in heads[family]:
                    heads[family].append(line)
                families.setdefault(family, [])
            elif line.strip():
                families.setdefault(family, []).append(_with_label(line, "model", model))
    out = []
    for family, samples in families.items():
        out += heads.get(family, []) + samples
    return "\n".join(out) + ("\n" if out else "")


def _with_label(sample: str, key: str, value: str) -> str:
    name_part, _, rest = sample.partition(" ")
    label = f'{key}="{_escape(value)}"'
    if name_part.endswith("}"):
        return f"{name_part[:-1]},{label}}} {rest}"
    return f"{name_part}{{{label}}} {rest}"
