"""Root cause: from the flagged ranks of one step to findings with one class each.

Decision rules (metric first, decision second; every rule names its deciding figure):

* a rank whose largest flagged excess is compile / GC / checkpoint / data-loader time is a
  JIT-compile stall / GC pause / checkpoint stall / data-loader stall;
* compute time -> a compute straggler, unless the rank also holds far more tokens than its
  group (then the data-parallel replicas' sequence lengths are imbalanced: not a GPU fault);
* a collective kind (its own transfer time, not waiting) -> link degradation; two such
  ranks on different hosts are one link between the hosts;
* no excess but far less collective time than its group -> the masked compute straggler:
  everyone else waits in collectives, the culprit is the one that waits least;
* several ranks of one host slow on the CPU side (data loader, host-to-device copies) ->
  host CPU contention;
* a group (pp stage) whose median compute exceeds the other groups' -> stage imbalance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from argus.schemas.causes import (
    CHECKPOINT_STALL,
    COMPUTE_STRAGGLER,
    DATALOADER_STALL,
    GC_PAUSE,
    HOST_CPU_CONTENTION,
    JIT_COMPILE_STALL,
    LINK_DEGRADATION,
    MASKED_COMPUTE_STRAGGLER,
    PIPELINE_STAGE_IMBALANCE,
    SEQUENCE_LENGTH_IMBALANCE,
    UNKNOWN,
)

from ._config import DiagnoserConfig
from ._finding import Finding
from .cross_rank import CAUSE_METRICS, LINK_METRICS, METRICS, CrossRankResult

__all__ = [
    "RULES",
    "Flagged",
    "Rule",
    "classify_ranks",
    "host_contention",
    "links",
    "replicas",
    "sequence_imbalance",
    "stage_imbalance",
    "stragglers",
]

_BY_METRIC = {
    "compute_ms": COMPUTE_STRAGGLER,
    "dataloader_ms": DATALOADER_STALL,
    "h2d_ms": DATALOADER_STALL,
    "gc_ms": GC_PAUSE,
    "compile_ms": JIT_COMPILE_STALL,
    "checkpoint_ms": CHECKPOINT_STALL,
    "unaccounted_ms": UNKNOWN,
    **dict.fromkeys(LINK_METRICS, LINK_DEGRADATION),
}
_CPU_SIDE = frozenset({COMPUTE_STRAGGLER, DATALOADER_STALL, MASKED_COMPUTE_STRAGGLER, UNKNOWN})
_IDX = {n: i for i, n in enumerate(METRICS)}
_CAUSE_ROWS = np.array([_IDX[n] for n in CAUSE_METRICS])


def _f(x: float) -> float:
    return round(float(x), 4)


def _deciding(cr: CrossRankResult) -> tuple[list[str], list[str]]:
    """Per flagged rank: its cause and its deciding metric."""
    ex = np.where(cr.pos[_CAUSE_ROWS], cr.excess[_CAUSE_ROWS], -np.inf)
    best = np.argmax(ex, axis=0) if len(cr.rows) else np.zeros(0, int)
    causes, metrics = [], []
    tok = _IDX["tokens"]
    for j in range(len(cr.rows)):
        if np.isfinite(ex[best[j], j]):
            m = CAUSE_METRICS[int(best[j])]
            cause = _BY_METRIC[m]
            if cause == COMPUTE_STRAGGLER and cr.pos[tok, j]:
                cause, m = SEQUENCE_LENGTH_IMBALANCE, "tokens"
            elif m == "unaccounted_ms" and cr.waits_least[j]:  # hidden work, peers wait for it
                cause, m = MASKED_COMPUTE_STRAGGLER, "collective_ms"
        else:
            cause, m = MASKED_COMPUTE_STRAGGLER, "collective_ms"
        causes.append(cause)
        metrics.append(m)
    return causes, metrics


def _rank_evidence(cr: CrossRankResult, j: int, metric: str) -> dict[str, float]:
    i = _IDX[metric]
    ev = {f"{metric}_z": _f(cr.z[i, j]), f"{metric}_excess": _f(cr.excess[i, j])}
    for extra in ("compute_ms", "collective_ms"):
        k = _IDX[extra]
        ev.setdefault(f"{extra}_z", _f(cr.z[k, j]))
    if metric == "collective_ms":
        u = _IDX["unaccounted_ms"]
        ev["unaccounted_ms_excess"] = _f(cr.excess[u, j])
    # a straggler's peers wait for it in collectives: how much longer they wait than it does
    ev["peers_wait_ms"] = _f(-cr.excess[_IDX["collective_ms"], j])
    ev["step_ms"] = _f(cr.step_ms)
    return ev


@dataclass
class Flagged:
    """The flagged ranks of one step as the rules see them: the cross-rank result, each
    rank's host, dp coordinate, cause and deciding metric, and which ranks a rule already
    explained (``used``)."""

    cr: CrossRankResult
    hosts: np.ndarray
    dp: np.ndarray
    causes: list[str]
    metrics: list[str]
    used: np.ndarray
    replicas: int = 0  # data-parallel replicas in the job (0: not known)


Rule = Callable[[Flagged, DiagnoserConfig], list[Finding]]
"""One decision: findings for some of the flagged ranks (marking them used)."""


def classify_ranks(
    cr: CrossRankResult,
    hosts: np.ndarray,
    dp: np.ndarray,
    config: DiagnoserConfig | None = None,
    *,
    rules: Sequence[Rule] | None = None,
    replicas: int = 0,
) -> list[Finding]:
    """Findings for the flagged ranks of one step.

    Args:
        cr: the step's cross-rank result.
        hosts: host name of every flagged rank (``batch["host"][cr.rows]``).
        dp: dp coordinate of every flagged rank.
        config: thresholds (``host_min_ranks``, ``group_min_frac``).
        rules: the decisions in order, each taking the ranks the ones before left
            (default :data:`RULES`: host contention, sequence length, links, replicas,
            stragglers).
        replicas: the job's data-parallel replicas (0: not known, no replica findings).
    """
    cfg = config or DiagnoserConfig()
    causes, metrics = _deciding(cr)
    flagged = Flagged(cr, hosts, dp, causes, metrics, np.zeros(len(cr.rows), bool), replicas)
    return [f for rule in (RULES if rules is None else rules) for f in rule(flagged, cfg)]


def host_contention(fl: Flagged, cfg: DiagnoserConfig) -> list[Finding]:
    """Several ranks of one host slow on the CPU side (data loader, copies): the host."""
    cr, hosts, causes = fl.cr, fl.hosts, fl.causes
    out: list[Finding] = []
    cpu = np.array([c in _CPU_SIDE for c in causes], bool)
    cpu_flag = cr.pos[_IDX["dataloader_ms"]] | cr.pos[_IDX["h2d_ms"]]
    if cpu.sum() >= cfg.host_min_ranks:
        hs, counts = np.unique(hosts[cpu & cpu_flag], return_counts=True)
        for h, cnt in zip(hs.tolist(), counts.tolist(), strict=True):
            if cnt < cfg.host_min_ranks:
                continue
            sel = cpu & (hosts == h)
            fl.used |= sel
            js = np.flatnonzero(sel)
            dl = _IDX["dataloader_ms"]
            added = float(np.max(cr.excess[_CAUSE_ROWS][:, js].clip(0).sum(axis=0)))
            ev = {
                "host_flagged_ranks": float(cnt),
                "dataloader_ms_z": _f(np.median(cr.z[dl, js])),
                "dataloader_ms_excess": _f(np.median(cr.excess[dl, js])),
                "h2d_ms_z": _f(np.median(cr.z[_IDX["h2d_ms"], js])),
                "compute_ms_z": _f(np.median(cr.z[_IDX["compute_ms"], js])),
                "step_ms": _f(cr.step_ms),
            }
            ranks = tuple(sorted(int(r) for r in cr.ranks[js]))
            out.append(
                Finding(
                    HOST_CPU_CONTENTION,
                    "cross_rank",
                    "host",
                    str(h),
                    ranks,
                    float(cnt),
                    "host_flagged_ranks",
                    ev,
                    added,
                )
            )
    return out


def sequence_imbalance(fl: Flagged, cfg: DiagnoserConfig) -> list[Finding]:
    """Ranks slow in compute that also hold far more tokens: the data-parallel replicas'
    sequence lengths are imbalanced (one finding for the replicas, not a GPU fault)."""
    cr, dp, causes, used = fl.cr, fl.dp, fl.causes, fl.used
    out: list[Finding] = []
    seq = np.array([c == SEQUENCE_LENGTH_IMBALANCE for c in causes], bool) & ~used
    if seq.any():
        js = np.flatnonzero(seq)
        tok, comp = _IDX["tokens"], _IDX["compute_ms"]
        heavy = js[int(np.argmax(cr.excess[comp, js]))]
        per_token = cr.value[comp, js] / np.maximum(cr.value[tok, js], 1.0)
        ev = {
            "tokens_z": _f(np.max(cr.z[tok, js])),
            "tokens_ratio": _f(cr.value[tok, heavy] / max(cr.value[tok, heavy] - cr.excess[tok, heavy], 1.0)),
            "compute_ms_z": _f(cr.z[comp, heavy]),
            "compute_ms_excess": _f(cr.excess[comp, heavy]),
            "compute_ms_per_ktoken": _f(1000.0 * float(np.median(per_token))),
            "replicas": float(len(np.unique(dp[js]))),
            "dp_index": float(dp[heavy]),
            "step_ms": _f(cr.step_ms),
        }
        out.append(
            Finding(
                SEQUENCE_LENGTH_IMBALANCE,
                "cross_rank",
                "dp_group",
                "dp",
                (),
                float(ev["tokens_z"]),
                "tokens_z",
                ev,
                float(cr.excess[comp, heavy]),
            )
        )
        fl.used |= seq
    return out


def links(fl: Flagged, cfg: DiagnoserConfig) -> list[Finding]:
    """Ranks whose own transfer time in a collective rose: paired into links (two ranks on
    different hosts are one link between the hosts)."""
    cr, hosts, causes, metrics, used = fl.cr, fl.hosts, fl.causes, fl.metrics, fl.used
    out: list[Finding] = []
    link = [j for j in range(len(causes)) if causes[j] == LINK_DEGRADATION and not used[j]]
    link.sort(key=lambda j: -float(cr.excess[_IDX[metrics[j]], j]))
    while link:
        pair = link[:2]
        link = link[2:]
        pair.sort(key=lambda j: (str(hosts[j]), int(cr.ranks[j])))
        names = [str(hosts[j]) for j in pair]
        if len(pair) == 2 and names[0] == names[1]:
            suspect = f"{names[0]}:rank:{int(cr.ranks[pair[0]])}<->rank:{int(cr.ranks[pair[1]])}"
        else:
            suspect = "<->".join(names) if len(pair) == 2 else f"{names[0]}:rank:{int(cr.ranks[pair[0]])}"
        j0 = pair[0]
        m = metrics[j0]
        ev = _rank_evidence(cr, j0, m)
        for j in pair[1:]:
            ev[f"{m}_z_peer_end"] = _f(cr.z[_IDX[m], j])
        added = float(max(cr.excess[_IDX[m], j] for j in pair))
        score = float(min(cr.z[_IDX[m], j] for j in pair))
        ranks = tuple(int(cr.ranks[j]) for j in pair)
        out.append(
            Finding(LINK_DEGRADATION, "cross_rank", "link", suspect, ranks, score, f"{m}_z", ev, added)
        )
        used[pair] = True
    return out


def replicas(fl: Flagged, cfg: DiagnoserConfig) -> list[Finding]:
    """Ranks of one data-parallel replica slow for one cause at once on several hosts, half
    of the replica or more: one finding of the replica (its ranks share its batches and the
    hosts it spans), not one per host and rank."""
    cr, hosts, causes, metrics, used = fl.cr, fl.hosts, fl.causes, fl.metrics, fl.used
    if fl.replicas < 2 or not len(fl.dp):
        return []
    per_replica = cr.n_ranks / fl.replicas
    out: list[Finding] = []
    rest = np.flatnonzero(~used).tolist()
    for d, cause in sorted({(int(fl.dp[j]), causes[j]) for j in rest}):
        js = [j for j in rest if int(fl.dp[j]) == d and causes[j] == cause]
        if len({str(hosts[j]) for j in js}) < 2 or len(js) < max(2 * cfg.host_min_ranks, per_replica / 2):
            continue
        used[js] = True
        out.append(_group_finding(cr, f"dp:{d}", cause, js, [metrics[j] for j in js], False))
    return out


def stragglers(fl: Flagged, cfg: DiagnoserConfig) -> list[Finding]:
    """Everything else: several ranks of one group slow for one cause at once are one
    finding (of their host when they share one), else one finding per rank."""
    cr, hosts, causes, metrics, used = fl.cr, fl.hosts, fl.causes, fl.metrics, fl.used
    out: list[Finding] = []
    rest = np.flatnonzero(~used).tolist()
    size = dict(zip(cr.group_keys.tolist(), cr.group_sizes.tolist(), strict=True))
    for g, cause in sorted({(int(cr.groups[j]), causes[j]) for j in rest}):
        members = [j for j in rest if int(cr.groups[j]) == g and causes[j] == cause]
        per_host: dict[str, int] = {}
        for j in members:
            per_host[str(hosts[j])] = per_host.get(str(hosts[j]), 0) + 1
        loose = sum(n for n in per_host.values() if n < cfg.host_min_ranks)  # not in a host's cluster
        many = max(cfg.host_min_ranks, cfg.group_min_frac * size.get(g, 0))  # more than noise flags
        if loose >= many and size.get(g, 0) >= cfg.group_min_size:  # slow across a large group
            # named by its group where the job has several (a pipeline stage); "ranks" where
            # the group is the whole job (no layout known: "pp:0" would read as a stage)
            where = f"{cfg.group_column}:{g}" if len(size) > 1 else "ranks"
            out.append(_group_finding(cr, where, cause, members, [metrics[j] for j in members], False))
        else:
            out.extend(_split_by_host(cr, hosts, cause, members, metrics, cfg))
    return out


RULES: tuple[Rule, ...] = (host_contention, sequence_imbalance, links, replicas, stragglers)
"""The default decisions, in order (swap or extend them, as HTA's rankers)."""


def _split_by_host(
    cr: CrossRankResult,
    hosts: np.ndarray,
    cause: str,
    js: list[int],
    metrics: list[str],
    cfg: DiagnoserConfig,
) -> list[Finding]:
    """Per host: one finding when several of its ranks share the cause, else per rank."""
    out = []
    for h in sorted({str(hosts[j]) for j in js}):
        hs = [j for j in js if str(hosts[j]) == h]
        if len(hs) >= cfg.host_min_ranks:
            out.append(_group_finding(cr, h, cause, hs, [metrics[j] for j in hs], True))
        else:
            out.extend(_rank_finding(cr, j, cause, metrics[j]) for j in hs)
    return out


def _rank_finding(cr: CrossRankResult, j: int, cause: str, m: str) -> Finding:
    i = _IDX[m]
    ev = _rank_evidence(cr, j, m)
    added = float(-cr.excess[i, j] if m == "collective_ms" else cr.excess[i, j])
    r = int(cr.ranks[j])
    return Finding(
        cause, "cross_rank", "rank", f"rank:{r}", (r,), abs(float(cr.z[i, j])), f"{m}_z", ev, added
    )


def _group_finding(
    cr: CrossRankResult, where: str, cause: str, js: list[int], ms: list[str], one_host: bool
) -> Finding:
    """Several ranks slow for one cause at once: one finding listing them. On one host:
    the node (power, cooling, PCIe switch, NIC), suspect kind ``host``; else the ranks of
    one group (a batch of bad GPUs, a rack), suspect kind ``ranks`` named by the group."""
    m = max(set(ms), key=ms.count)
    i = _IDX[m]
    sign = -1.0 if m == "collective_ms" else 1.0
    ev = {
        "flagged_ranks": float(len(js)),
        f"{m}_z": _f(np.median(np.abs(cr.z[i, js]))),
        f"{m}_excess": _f(np.median(sign * cr.excess[i, js])),
        "step_ms": _f(cr.step_ms),
    }
    ranks = tuple(sorted(int(r) for r in cr.ranks[js]))
    added = float(np.max(sign * cr.excess[i, js]))
    kind = "host" if one_host else "ranks"
    return Finding(cause, "cross_rank", kind, where, ranks, float(ev[f"{m}_z"]), f"{m}_z", ev, added)


def stage_imbalance(
    cr: CrossRankResult, group_column: str, config: DiagnoserConfig | None = None
) -> list[Finding]:
    """Groups (pp stages) whose median compute exceeds the median of the other groups'.

    A static layout problem, not a fault: every rank of the stage is equally slow, so no
    rank stands out within its stage; the stages are compared with each other instead.
    """
    cfg = config or DiagnoserConfig()
    med = cr.group_median[_IDX["compute_ms"]]
    g = len(med)
    if g < 2:
        return []
    out: list[Finding] = []
    srt = np.sort(med)
    lo, hi = (g - 2) // 2, (g - 1) // 2  # median positions among the g - 1 others
    for s in np.flatnonzero(med >= srt[hi]).tolist():  # only the upper half can be too slow
        p = int(np.searchsorted(srt, med[s]))
        ref = 0.5 * float(srt[lo + (lo >= p)] + srt[hi + (hi >= p)])
        ratio = float(med[s]) / max(ref, 1e-9)
        excess = float(med[s]) - ref
        if ratio < cfg.stage_ratio or excess < cr.min_excess_ms:
            continue
        key = int(cr.group_keys[s])
        p2p = _IDX["p2p_ms"]
        ev = {
            "stage_compute_ratio": _f(ratio),
            "stage_compute_excess": _f(excess),
            "stage_compute_ms": _f(med[s]),
            "other_stages_compute_ms": _f(ref),
            "other_stages_p2p_ms": _f(np.median(cr.group_median[p2p])),
            "stage_p2p_ms": _f(cr.group_median[p2p, s]),
            "step_ms": _f(cr.step_ms),
        }
        out.append(
            Finding(
                PIPELINE_STAGE_IMBALANCE,
                "cross_rank",
                "stage",
                f"{group_column}:{key}",
                (),
                ratio,
                "stage_compute_ratio",
                ev,
                excess,
            )
        )
    return out
