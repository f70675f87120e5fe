"""free_benchmark's preheat: a ratio threshold learned per API and dtype against the CPU.

Why: one perturbation can move some well-conditioned outputs by more than the dtype's fixed
threshold (a bf16 ulp is 0.4-0.8 %, above bf16's 0.4 %), and a user who trusts the CPU wants no
alarm for those. Preheat asks the CPU which ratios are normal for each API and widens or tightens
the threshold accordingly. It is a heuristic (the reference's doubling/halving rule), kept in one
place here; the probe only reports calls, samples and verdicts to it.

Per API (msprobe counted calls in step 0 only, so a run without step 0 never sampled; it sampled
P - 1 steps, and one frozen dtype blocked the adjustment of the others):

* census step = the first step in which the API is called, whatever its number (step filters,
  a run that starts mid-way): its calls are counted (B), nothing is compared;
* sampling steps = the next `preheat_step` steps in which the API is called (exactly that many):
  in sampling step j, k = min(ceil(B / P), max_sample) calls are sampled, spread over the steps
  (call numbers ((P*(i-1) + j) mod B) or B, i = 1..k, as the reference); a sampled call is also run
  on the CPU and its ratio recorded with the CPU verdict, per output dtype;
* at the end of each sampling step every dtype with samples is adjusted on its own (no dtype
  blocks another);
* then the learned threshold judges every later call of that API and dtype; a dtype never
  sampled keeps the default threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

INITIAL_THRESHOLD = 2.05  # the reference's starting T: lax, tightened by consistent samples
WIDEN_FACTOR = 2.0  # a sample the CPU vouches for above T (a false alarm) doubles T's excess over 1
TIGHTEN_FACTOR = 0.5  # a step with no false alarm halves it
# Tightening never goes below 1 + HEADROOM * (excess of the largest ratio the CPU vouched for), so
# a threshold cannot end preheat on a halving step just under the API's normal ratios (the
# reference oscillates around them and may finish below).
HEADROOM = 2.0

CENSUS, SAMPLING, DONE = "census", "sampling", "done"


@dataclass
class DtypeState:
    """The learned threshold of one (API, dtype)."""

    floor: float  # the default T of the dtype: preheat never goes below it
    threshold: float = INITIAL_THRESHOLD
    frozen: bool = False  # set when the CPU disagreed with every sample above some ratio
    samples: int = 0
    vouched: float = 1.0  # largest finite ratio whose call agreed with the CPU
    steps: list[int] = field(default_factory=list)  # sampling steps that adjusted it
    pending: list[tuple[float, bool]] = field(default_factory=list)  # (ratio, cpu_ok) of this step

    def adjust(self, step: int) -> None:
        """The step's adjustment rule (msprobe's doubling/halving, plus HEADROOM)."""
        pending, self.pending = self.pending, []
        if self.frozen or not pending:
            return
        self.steps.append(step)
        con = [r for r, ok in pending if ok]
        inc = [r for r, ok in pending if not ok]
        old = self.threshold
        finite = [r for r in con if math.isfinite(r)]
        if finite:
            self.vouched = max(self.vouched, max(finite))
        if inc and (not con or min(inc) > max(con)):
            # the CPU rejects the calls from min(inc) up: freeze with the excess halved below it, so
            # ratios like the rejected ones are flagged (the reference froze at min(inc) itself,
            # which lets a defect whose ratio is always the same pass)
            new = 1.0 + TIGHTEN_FACTOR * (min(min(inc), old) - 1.0)
            self.frozen = True
        elif inc:
            new = old  # the ratio does not separate what the CPU accepts from what it rejects
        else:
            new = 1.0 + (WIDEN_FACTOR if max(con) > old else TIGHTEN_FACTOR) * (old - 1.0)
            new = max(new, 1.0 + HEADROOM * (self.vouched - 1.0))
        self.threshold = max(new, self.floor)

    def to_dict(self) -> dict[str, Any]:
        return {"threshold": _num(self.threshold), "frozen": self.frozen, "samples": self.samples,
                "steps": list(self.steps), "max_cpu_consistent_ratio": _num(self.vouched)}


@dataclass
class ApiState:
    """Where one API is in its preheat."""

    census_step: int | None = None
    census_calls: int = 0  # B
    sampling_steps: list[int] = field(default_factory=list)
    step: int | None = None  # step of the last call
    phase: str = CENSUS
    calls: int = 0  # calls in this step
    sampled: frozenset[int] = frozenset()  # call numbers (1-based) sampled in this step
    dtypes: dict[str, DtypeState] = field(default_factory=dict)

    def close_step(self) -> None:
        if self.phase == SAMPLING and self.step is not None:
            for state in self.dtypes.values():
                state.adjust(self.step)


def sample_set(census_calls: int, preheat_step: int, max_sample: int, j: int) -> frozenset[int]:
    """Call numbers sampled in sampling step j (1..P): k of them, spread over the P steps."""
    if census_calls <= 0:
        return frozenset()
    k = min(math.ceil(census_calls / preheat_step), max_sample)
    return frozenset(((preheat_step * (i - 1) + j) % census_calls) or census_calls for i in range(1, k + 1))


class Preheat:
    """The preheat state of one run, keyed by API and dtype name."""

    def __init__(self, preheat_step: int, max_sample: int) -> None:
        self.preheat_step = preheat_step
        self.max_sample = max_sample
        self.apis: dict[str, ApiState] = {}

    def on_call(self, api: str, step: int) -> tuple[str, bool]:
        """Count a call of `api` in `step`: (its phase, whether it is sampled)."""
        st = self.apis.get(api)
        if st is None:
            st = self.apis[api] = ApiState()
        if st.step != step:
            st.close_step()
            st.step, st.calls = step, 0
            if st.census_step is None:
                st.census_step, st.phase = step, CENSUS
            elif len(st.sampling_steps) < self.preheat_step:
                st.sampling_steps.append(step)
                st.phase = SAMPLING
                st.sampled = sample_set(st.census_calls, self.preheat_step, self.max_sample, len(st.sampling_steps))
            else:
                st.phase, st.sampled = DONE, frozenset()
        st.calls += 1
        if st.phase == CENSUS:
            st.census_calls += 1
        return st.phase, st.phase == SAMPLING and st.calls in st.sampled

    def record(self, api: str, dtype: str, ratio: float, cpu_ok: bool, floor: float) -> None:
        """One sampled output leaf: its ratio and whether the call agreed with the CPU."""
        st = self.apis[api]
        state = st.dtypes.get(dtype)
        if state is None:
            state = st.dtypes[dtype] = DtypeState(floor=floor)
        state.samples += 1
        if not state.frozen:
            state.pending.append((ratio, cpu_ok))

    def threshold(self, api: str, dtype: str, default: float) -> float:
        """T for a leaf of this API and dtype: during preheat the current one (INITIAL_THRESHOLD
        before any adjustment); after it the learned one, or `default` when never sampled."""
        st = self.apis.get(api)
        state = st.dtypes.get(dtype) if st is not None else None
        if st is None or st.phase != DONE:
            return state.threshold if state is not None else INITIAL_THRESHOLD
        return state.threshold if state is not None and state.steps else default

    def in_preheat(self, api: str) -> bool:
        st = self.apis.get(api)
        return st is None or st.phase != DONE

    def end_step(self) -> list[str]:
        """Adjust every API sampled in the step that ends; the APIs whose preheat just ended."""
        ended = []
        for api, st in self.apis.items():
            st.close_step()
            st.step = None
            if st.phase == SAMPLING and len(st.sampling_steps) >= self.preheat_step:
                st.phase = DONE
                ended.append(api)
        return ended

    def describe(self, api: str) -> dict[str, Any] | None:
        st = self.apis.get(api)
        if st is None:
            return None
        return {
            "phase": st.phase, "census_step": st.census_step, "census_calls": st.census_calls,
            "sampling_steps": list(st.sampling_steps),
            "dtypes": {d: s.to_dict() for d, s in sorted(st.dtypes.items())},
        }


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else "inf"
