"""What a multi-turn rollout reports: per-step `env/...` metrics and whole conversations for the samples table.

Metrics are returned, not logged (only apps/ talk to MLflow):

    env/turns_mean        assistant turns per episode
    env/tool_calls        tool calls in the batch (parsed, well-formed)      env/tool_call_rate   episodes with >= 1 call
    env/tool_errors       calls that returned an error, crashed or timed out
    env/malformed_calls   turns that opened a tool call they did not finish   env/malformed_rate   per attempted call
    env/failed_turns      steps that raised or ran past the timeout (episode ended with the failure reward)
    env/truncated         episodes stopped by the token budget or max_turns (fraction)
    env/reward/<part>     mean of each reward part over the episodes
"""

from __future__ import annotations

import statistics

from forge_exp.rewards.combine import component_means
from forge_exp.rl.types import Group


def episode_metrics(groups: list[Group]) -> dict[str, float]:
    comps = [c for g in groups for c in g.completions]
    if not comps:
        return {}
    total = lambda key: float(sum(c.info.get(key, 0.0) for c in comps))  # noqa: E731
    calls, malformed = total("tool_calls"), total("malformed_calls")
    out = {
        "env/episodes": float(len(comps)),
        "env/turns_mean": total("turns") / len(comps),
        "env/tool_calls": calls,
        "env/tool_call_rate": statistics.fmean(float(c.info.get("tool_calls", 0) > 0) for c in comps),
        "env/tool_errors": total("tool_errors"),
        "env/malformed_calls": malformed,
        "env/malformed_rate": malformed / (calls + malformed) if calls + malformed else 0.0,
        "env/failed_turns": total("failed_turns"),
        "env/truncated": statistics.fmean(float(c.truncated) for c in comps),
        "env/tokens_mean": statistics.fmean(len(c.token_ids) for c in comps),
        "env/reset_failures": float(sum(g.completions[0].info.get("reset_failures", 0.0) for g in groups if g.completions)),
    }
    out.update({f"env/reward/{part}": v for part, v in component_means(groups).items()})
    return out


def render_conversation(messages: list[dict] | None) -> str:
    """`role: content` lines, tool calls shown as name(arguments), for a text column of the samples table."""
    lines = []
    for m in messages or []:
        content = str(m.get("content", ""))
        for call in m.get("tool_calls", []) or []:
            fn = call.get("function", call)
            content += f" -> {fn.get('name')}({fn.get('arguments')})"
        lines.append(f"{m.get('role', '?')}: {content.strip()}")
    return "\n".join(lines)


def conversation_rows(groups: list[Group], k: int = 2) -> list[dict]:
    """The first completion of the first k groups as samples-table rows (one whole conversation per row)."""
    rows = []
    for g in groups[:k]:
        c = g.completions[0]
        rows.append(
            {
                "version": c.policy_version,
                "prompt": g.problem.prompt,
                "conversation": render_conversation(c.messages),
                "target": g.problem.target,
                "reward": g.rewards[0],
                "turns": c.info.get("turns", 1.0),
                "stop_reason": c.stop_reason,
            }
        )
    return rows
