"""Which commit made it slower (or broke parity)? A binary search over the commits of the
code under test, each measured against the good commit.

    python -m orchestrator.bisect --good REV --bad REV [--repo PATH] [--path DIR] [--variant NAME] \\
        [--metric latency|parity] -- <the sweep's overrides>
    python -m orchestrator.bisect --pip NAME==V1,V2,...,VN [--variant NAME] [--metric ...] -- <overrides>

--pip searches released versions of one library instead of commits, in the order given (V1
good, VN bad): each version's variant runs with env.pip pinning it, in its own environment made
once per machine (tasks/worker/envs.py), and is timed interleaved against V1's, which runs in
its own environment beside it. --variant names the variant without its version suffix.

--repo is the git repository of the code under test (default: this one), typically a runtime
(or format) module outside phasesweep that the config names by module path; --path names its
folders that go on the import path (default: the repository's top; repeat for more). The
overrides are a sweep's (`backend=... model=... phase=...`, `hydra.searchpath=[...]` for the
module's yaml); they must plan one variant, or --variant picks one.

Each commit measured is checked out in a git worktree of its own under a temporary folder
(the user's checkout is never touched) and removed afterwards. Its export is reused when the
commit leaves the export's inputs alone (orchestrator/run/bisect_steps.py).

--metric latency: the bad commit is first timed against the good one, interleaved (as
`compare --remeasure` does, tasks/paired.py); it must be slower: its ratio's 95% interval wholly
above 1 and its median beyond 1 + --min-effect. Each step then times its commit against the
good commit the same way, and calls it bad when the ratio's interval lies wholly above 1 + half
the slowdown the bad commit's interval is sure of (its lower end; at least --min-effect), good
when it lies wholly below that edge; an interval still across the edge at
--max-seconds leaves the decision to its median ratio (the step says "undecided"). A drift of
the machine's speed falls on both sides of each round alike, so it cannot pick the commit.
--metric parity: a commit is bad when its benchmark's parity check fails (the good commit
must pass, the bad one fail; the good commit's check is step 0).
--metric quality: a commit is bad when it lost quality (bench.quality's perplexity, or top-1
without one) against the good commit's, as compare defines a loss; the good commit's is step 0.

A commit whose export, load or run fails is skipped, as `git bisect skip` does. The search is recorded in MLflow (the sweep's
tracking settings): a run tagged phasesweep.role=bisect with the ratio at each step as a
step metric and the verdict, one child run per commit measured.

Exit status: 0 when one first bad commit is named, 1 when the ends do not differ or skipped
commits leave several suspects, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.record.bisect_runs import BisectRuns
from orchestrator.run.bisect_steps import (
    BAD,
    GOOD,
    METRICS,
    SKIP,
    Release,
    Side,
    Step,
    Target,
    export_for,
    export_planned,
    latency_step,
    parity_step,
    plan_variant,
    quality_step,
    releases,
)
from orchestrator.run.checkout import Commit, between, check_order, resolve, root_of, worktree
from tasks.paired import PairOptions
from tasks.specs import ConfigError
from tasks.worker.fresh import importing_from

HERE = Path(__file__).resolve().parents[1]  # this repository's top


def search(commits: list[Commit], judge: Callable[[Commit], Step]) -> tuple[list[Step], list[Commit]]:
    """git bisect's search over `commits` (after the good commit, the last one bad): the steps
    taken and the suspects, the first bad commit alone when no skipped commit hides it."""
    lo, hi, skipped, steps = -1, len(commits) - 1, set(), []
    while hi - lo > 1:
        untried = [i for i in range(lo + 1, hi) if i not in skipped]
        if not untried:
            break
        mid = (lo + hi) / 2
        i = min(untried, key=lambda j: (abs(j - mid), j))
        steps.append(step := judge(commits[i]))
        if step.verdict == GOOD:
            lo = i
        elif step.verdict == BAD:
            hi = i
        else:
            skipped.add(i)
    return steps, commits[lo + 1 : hi + 1]


def bad_end(step: Step) -> bool:
    """Whether the bad end differs from the good one: parity broken, or slower for sure (its
    interval wholly above 1) by more than --min-effect (its median, at --max-seconds)."""
    if step.verdict != BAD:
        return False
    return step.decided or (step.ci is not None and step.ci[0] > 1)


class Bisect:
    """One search: the good commit checked out for its whole length, each other commit for its step."""

    AXIS = "commit"  # what the search steps over: its messages and MLflow tags

    def __init__(self, args: argparse.Namespace, overrides: list[str], work: Path):
        self.args, self.work = args, work
        self.repo = root_of(Path(args.repo).resolve()) if args.repo else HERE
        paths = tuple(args.path or ["."])
        if self.repo == HERE and paths == (".",):
            raise ConfigError(
                "--repo is this repository: give --path DIR, the folder of the module under test that goes on the "
                "import path (e.g. --path tests/spin_backend); phasesweep's own tasks/ is not bisected this way"
            )
        self.good, self.bad = resolve(self.repo, args.good, "--good"), resolve(self.repo, args.bad, "--bad")
        check_order(self.repo, self.good, self.bad)
        self.commits = between(self.repo, self.good, self.bad)
        self.overrides, self.paths = overrides, paths
        self.options = PairOptions(max_seconds=args.max_seconds, target_ci=args.target_ci, min_effect=args.min_effect)
        self.seen: list[Step] = []  # every commit measured, in order (step 0: the bad end)
        self.reference: dict[str, float] | None = None  # --metric quality: the good end's metrics

    def run(self) -> int:
        with worktree(self.repo, self.good, self.work) as good_dir:
            with importing_from([str((good_dir / p).resolve()) for p in self.paths]):  # the module under test validates the config
                planned, tracking = plan_variant(self.overrides, self.args.variant)
            self.target = Target.of(planned, self.repo, self.paths, good_dir)
            spec, why = export_for(self.target, self.good, good_dir, self.args.timeout)
            if spec is None:
                raise ConfigError(f"--good {self.good.short} does not run: {why}")
            self.good_side = (spec, self.target.import_paths(good_dir))
            say(f"bisect {planned.name} ({self.args.metric}) in {self.repo}: {len(self.commits)} commits after "
                f"{self.good.short} up to {self.bad.short}, each in a worktree under {self.work}")
            self.log = BisectRuns(tracking, f"bisect {planned.name} {self.good.short}..{self.bad.short}", self.params(planned.name))
            return self.search()

    def single(self, side: Side, point: Commit | Release) -> Step:
        """--metric parity or quality: the point's own benchmark; quality's judged against the
        good end's, measured first (self.reference)."""
        if self.args.metric == "parity":
            return parity_step(side, point, self.args.timeout)
        step, metrics = quality_step(side, point, self.args.timeout, self.reference)
        if self.reference is None and step.verdict == GOOD:
            self.reference = metrics
        return step

    def params(self, name: str) -> dict[str, str]:
        a = self.args
        return {"variant": name, "metric": a.metric, "repo": str(self.repo), "paths": " ".join(self.paths),
                "good": self.good.sha, "bad": self.bad.sha, "commits": str(len(self.commits)),
                "min_effect": str(a.min_effect), "overrides": " ".join(self.overrides)}

    def search(self) -> int:
        if self.args.metric != "latency":  # the good end must pass parity, or give quality's reference
            start = self.record(self.single(self.good_side, self.good))
            if start.verdict != GOOD:
                return self.finish(f"the good {self.AXIS} {self.good.short} fails {self.args.metric}: {start.detail}", [], 1)
        end = self.measure(self.bad)
        if not bad_end(end):
            return self.finish(f"the bad {self.AXIS} {self.bad.short} is not bad against {self.good.short}: {end.detail}", [], 1)
        if self.args.metric == "latency" and end.ci is not None:  # steps judged against half the slowdown the bad end is sure of
            self.options = replace(self.options, min_effect=max(self.args.min_effect, (end.ci[0] - 1) / 2))
        _, suspects = search(self.commits, self.measure)
        if len(suspects) == 1:
            c = suspects[0]
            what = {"latency": "slower", "parity": "broke parity", "quality": "lost quality"}[self.args.metric]
            return self.finish(f"first bad {self.AXIS}: {f'{c.sha} {c.subject}'.strip()} ({what})", suspects, 0)
        listed = ", ".join(c.short for c in suspects)
        return self.finish(f"the first bad {self.AXIS} is one of {listed} (skipped {self.AXIS}s hide which)", suspects, 1)

    def measure(self, commit: Commit) -> Step:
        """`commit` checked out, exported (or its export reused) and judged against the good commit."""
        number = len(self.seen)
        say(f"[step {number}] {commit.short} {commit.subject}: measuring ...")
        with worktree(self.repo, commit, self.work) as checkout:
            spec, why = export_for(self.target, commit, checkout, self.args.timeout)
            if spec is None:
                step = Step(commit, "skip", why or "")
            elif self.args.metric == "latency":
                step = latency_step(self.target.planned.name, self.good_side, (spec, self.target.import_paths(checkout)), commit, self.options)
            else:
                step = self.single((spec, self.target.import_paths(checkout)), commit)
        return self.record(step)

    def record(self, step: Step) -> Step:
        """A commit's verdict said, kept and logged as the search's next step."""
        number, commit = len(self.seen), step.commit
        self.seen.append(step)
        say(f"[step {number}] {commit.short} {step.verdict.upper()}: {step.detail}")
        self.log.step(number, commit.sha, commit.subject, step.verdict, step.detail, step.ratio, step.ci, step.seconds)
        return step

    def finish(self, verdict: str, suspects: list[Commit], status: int) -> int:
        say(f"measured {len(self.seen)} {self.AXIS}s besides the good one:")
        for number, s in enumerate(self.seen):
            ratio = f"ratio {s.ratio:.3f}" if s.ratio is not None else "ratio -"
            say(f"  {number:>2}  {s.commit.short}  {s.verdict:<4}  {ratio}  {s.commit.subject}")
        print(verdict, flush=True)
        first = suspects[0].sha if len(suspects) == 1 else None
        self.log.finish(verdict, first, [c.sha for c in suspects], status == 0)
        say(f"recorded as MLflow run {self.log.run_id}")
        return status


class VersionBisect(Bisect):
    """The same search over released versions of one library (--pip): each version's variant
    planned with env.pip pinning it, exported and measured in its own environment."""

    AXIS = "version"

    def __init__(self, args: argparse.Namespace, overrides: list[str], work: Path):
        self.args, self.work, self.overrides = args, work, overrides
        if any(o.split("=", 1)[0].lstrip("+~") == "env.pip" for o in overrides):
            raise ConfigError("--pip sets env.pip for each version: leave env.pip out of the sweep's overrides")
        found = releases(args.pip)
        self.good, self.bad, self.commits = found[0], found[-1], found[1:]
        self.options = PairOptions(max_seconds=args.max_seconds, target_ci=args.target_ci, min_effect=args.min_effect)
        self.seen: list[Step] = []
        self.reference: dict[str, float] | None = None

    def plan(self, release: Release) -> tuple[Any, Any]:
        """The variant with env.pip pinning `release` (--variant names it without its pins)."""
        name = self.args.variant and self.args.variant + release.env.tag
        return plan_variant([*self.overrides, f'env.pip="{release.pin}"'], name)

    def run(self) -> int:
        planned, tracking = self.plan(self.good)
        spec, why = export_planned(planned, planned.bench.export_dir, (), self.args.timeout)
        if spec is None:
            raise ConfigError(f"--pip: the good end {self.good.pin} does not run: {why}")
        self.good_side = (spec, ())
        say(f"bisect {planned.name} ({self.args.metric}): {len(self.commits)} versions after {self.good.pin} up to "
            f"{self.bad.pin}, each in its own environment")
        params = {"variant": planned.name, "metric": self.args.metric, "pip": self.args.pip, "versions": str(len(self.commits)),
                  "min_effect": str(self.args.min_effect), "overrides": " ".join(self.overrides)}
        self.log = BisectRuns(tracking, f"bisect {planned.name} {self.good.pin}..{self.bad.pin}", params, self.AXIS)
        return self.search()

    def measure(self, commit: Commit | Release) -> Step:
        """The release's variant exported (or its export reused) and judged against the good end's."""
        say(f"[step {len(self.seen)}] {commit.short}: measuring ...")
        planned, _ = self.plan(commit)
        spec, why = export_planned(planned, planned.bench.export_dir, (), self.args.timeout)
        if spec is None:
            return self.record(Step(commit, SKIP, why or ""))
        if self.args.metric == "latency":
            return self.record(latency_step(planned.name, self.good_side, (spec, ()), commit, self.options))
        return self.record(self.single((spec, ()), commit))


def say(line: str) -> None:
    print(line, flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orchestrator.bisect", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--good", help="a commit where the variant is fine")
    p.add_argument("--bad", help="a later commit where it is slower (or broken)")
    p.add_argument("--pip", help="NAME==V1,V2,...: search these released versions of one library instead (V1 good, the last bad)")
    p.add_argument("--repo", default=None, help="the git repository of the code under test (default: this one)")
    p.add_argument("--path", action="append", help="a folder of --repo to put on the import path (default: its top; repeatable)")
    p.add_argument("--variant", default=None, help="the variant to search, when the overrides plan several")
    p.add_argument("--metric", default="latency", choices=METRICS, help="what makes a commit bad")
    p.add_argument("--min-effect", type=float, default=0.05, help="latency: the smallest slowdown that counts at the bad end")
    p.add_argument("--max-seconds", type=float, default=120.0, help="latency: timed seconds per step at most")
    p.add_argument("--target-ci", type=float, default=0.01, help="latency: a step also stops once its interval is this narrow")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds an export or a parity benchmark may take")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, overrides = parser().parse_args(argv[:cut]), argv[cut + 1 :]
    if bool(args.pip) == bool(args.good and args.bad) or (args.pip and (args.good or args.bad or args.repo or args.path)):
        print("bisect: give --good and --bad (commits), or --pip NAME==V1,V2,... (versions) alone", file=sys.stderr)
        return 2
    if not (args.min_effect > 0 and args.max_seconds > 0 and 0 < args.target_ci < 1):
        print("bisect: need --min-effect > 0, --max-seconds > 0 and 0 < --target-ci < 1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="phasesweep-bisect-") as work:
        try:
            return (VersionBisect if args.pip else Bisect)(args, overrides, Path(work)).run()
        except ConfigError as e:
            print(f"bisect: {e}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
