"""A run folder of `simdist-adapt-experiment` as text: the table of its evaluations and a summary
of what it holds so far (finished or not), which `make demo` prints for the committed headline run.
"""

from __future__ import annotations

import json
import os
import pathlib


def read_rounds(root: pathlib.Path) -> list[dict]:
    """A method's `rounds.json` (empty before its first round)."""
    path = root / "rounds.json"
    return json.loads(path.read_text()) if path.is_file() else []


def write_json(path: pathlib.Path, data) -> None:
    """Write `data` as JSON by rename: a kill leaves the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, default=float))
    os.replace(tmp, path)


def run_summary(out: str | os.PathLike) -> str:
    """What a run folder holds so far, finished or not: its command, the planner it ran with and
    the table of every evaluation done (zero-shot, then each evaluated round of each method)."""
    out = pathlib.Path(out)
    config = json.loads((out / "config.json").read_text())
    planner = config["planner"]
    setting = (
        f"{planner['num_samples']} + {int(planner['num_samples'] * planner['mixture_coef'])} "
        f"samples x {planner['iterations']} iterations, {planner['num_elites']} elites, "
        f"replan period {planner['replan_period']}, {planner['evaluator']} {planner['precision']}"
    )
    methods: dict[str, dict] = {}
    zero_file = out / "zero_shot.json"
    finished = (
        json.loads((out / "results.json").read_text())["methods"]
        if (out / "results.json").is_file()
        else {}
    )
    for name in config["config"]["methods"]:
        if name in finished:
            methods[name] = finished[name]
            continue
        if not (out / name / "rounds.json").is_file() or not zero_file.is_file():
            continue  # not started, or pi alone (its one evaluation is in results.json when done)
        rounds = read_rounds(out / name)
        done = [r for r in rounds if r["score"] is not None]
        methods[name] = {
            "curve": [{"real_episodes": 0, **json.loads(zero_file.read_text())}]
            + [{"real_episodes": r["collected"], **r["score"]} for r in done],
            "rounds": [r["report"] for r in done],
        }
    if not methods and zero_file.is_file():  # zero-shot done, no round evaluated yet
        zero = json.loads(zero_file.read_text())
        methods["zero_shot"] = {"curve": [{"real_episodes": 0, **zero}], "rounds": []}
    planned = config["config"]["rounds"]
    state = ", ".join(
        f"{name} {len(m['rounds'])}/{planned} rounds" for name, m in methods.items() if m["rounds"]
    ) or ("zero-shot only" if methods else "zero-shot evaluation in progress")
    lines = [
        f"run folder: {out} ({state})",
        f"command:    {config['command']}",
        f"planner:    {setting}",
    ]
    if methods:
        lines.append(format_table({"methods": methods}))
    else:
        lines.append(f"zero-shot so far: {_zero_shot_so_far(out, config) or 'no episode yet'}")
    return "\n".join(lines)


def _zero_shot_so_far(out: pathlib.Path, config: dict) -> str:
    """The pretrained model's planner episodes on evaluation seeds that the store holds, per
    commanded speed: what a zero-shot evaluation cut short has measured."""
    per_speed: dict[float, list[bool]] = {}
    for file in (out / "episodes").glob("*.json"):
        data = json.loads(file.read_text())
        job = data["job"]
        if (
            job.get("checkpoint") == config["checkpoint_digest"]
            and job.get("agent") == "planner"
            and not job.get("record")
            and job.get("seed", -1) < config["config"]["eval_episodes"]
        ):
            speed = job.get("course", {}).get("speed")
            per_speed.setdefault(speed, []).append(bool(data["episode"]["success"]))
    return ", ".join(
        f"{sum(v)}/{len(v)} at {k:g} m/s" for k, v in sorted(per_speed.items(), key=str)
    )


def fraction(score: dict | None) -> str:
    return "-" if score is None else f"{score['successes']}/{score['episodes']}"


def format_table(results: dict) -> str:
    """One row per evaluation: success k / n at the headline speed (and at each other speed),
    successes per minute of robot time, return, distance, falls and the mean time to the fall,
    the round's held-out latent loss ("-": undefined, or a score from before the figure)."""
    other = sorted(
        {
            s
            for r in results["methods"].values()
            for c in r["curve"]
            for s in c.get("other_speeds", {})
        },
        key=float,
    )
    lines = [
        f"{'method':18} {'real eps':>8} {'success':>8} "
        + "".join(f"{s + ' m/s':>9} " for s in other)
        + f"{'succ/min':>8} {'return':>8} {'distance':>9} {'fell':>5} {'to fall':>8} "
        + f"{'held-out loss before->after':>30}"
    ]
    for name, r in results["methods"].items():
        for k, c in enumerate(r["curve"]):
            loss = ""
            if k >= 1 and r["rounds"][k - 1]["heldout_candidate"] is not None:
                rd = r["rounds"][k - 1]
                refused = "" if rd["deployed"] else " (refused)"
                loss = f"{rd['heldout_deployed']:.4f} -> {rd['heldout_candidate']:.4f}{refused}"
            dist = "-" if c["mean_distance"] is None else f"{c['mean_distance']:.2f}"
            falls = "-" if c.get("falls") is None else str(c["falls"])
            to_fall = c.get("mean_time_to_fall_s")
            to_fall = "-" if to_fall is None else f"{to_fall:.1f} s"
            speeds = "".join(f"{fraction(c.get('other_speeds', {}).get(s)):>9} " for s in other)
            lines.append(
                f"{name:18} {c['real_episodes']:8d} {fraction(c):>8} "
                f"{speeds}{c['successes_per_minute']:8.2f} {c['mean_return']:8.2f} {dist:>9} "
                f"{falls:>5} {to_fall:>8} {loss:>30}"
            )
    return "\n".join(lines)
