"""The red team: one of six peers runs an attack; is it caught, does it pay, does the model suffer?

Runs a clean swarm and then one swarm per attack, one after another, each a real local swarm (an
aggregator and six peer processes, the testbed's), with the same task and rounds: on 127.0.0.1, or
with ``--sites N`` on the testbed's emulated internet (N sites, the peers dealt out round-robin, each
site's peers one cohort; ``--uplink``/``--downlink``/``--delay`` shape every site's access link; needs
root).
Peer 5 is the attacker (``tests/adversaries/dishonest_peer.py``: the real peer with one part
replaced); the others are honest. For ``forged-state`` peer 4 joins late, so that someone catches up
while the forger serves its state. Per attack it prints, side by side with the clean run:

- caught: the first round whose receipt of the attacker was refused or revoked (receipt attacks), or
  the first attempt in which honest peers' reducers named it an outlier (gradient attacks);
- credit the attacker kept, against the mean honest peer's (from the ledger, revocations applied);
- accuracy of the largest and smallest sub-network (the final state, evaluated by the testbed)
  against the clean run's, in percentage points (target: within 1 pp);
- the honest peers' mean round time against the clean run's (the cost to them).

"clean" runs with robust averaging (the default), "plain" without: their difference is what
robustness costs an honest swarm.

    python -m benchmarks.red_team [--rounds 12] [--attacks all|name,name] [--out DIR]
                                  [--sites 2 --uplink 50mbit --downlink 50mbit --delay 20]
                                  [--sync outer --inner-steps 5] [--commit certificates]

With ``--sync outer`` each round is an inner step inside the cohort (its members meet as a known
group, robust like any stage) and cohorts meet every ``--inner-steps`` rounds in an outer step: a
poisoned gradient then reaches the cohort's inner steps, which the cohort's reducers must withstand.

With ``--commit certificates`` the swarms' rounds are decided by commit certificates, and the
attacks on them (``tests/adversaries/vote_attacks.py``) run too.

Each swarm takes 2-4 minutes on two cores. benchmarks/RESULTS.md records its table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from protocol.identity import Identity
from protocol.records import ContributionReceipt, Revocation
from protocol.sealing import parse_sealed
from testbed.interrupts import stop_signals_held, stop_signals_interrupt
from testbed.local_swarm import AGGREGATOR_GRACE_SECONDS, LocalSwarm, SwarmOptions
from testbed.summary import summarise
from testbed.wan.netns import TestbedError, require_privileges
from testbed.wan.rates import RateError, parse_rate
from testbed.wan.scenario import LinkProfile, Scenario, ScenarioError, uniform_scenario
from testbed.wan.topology import EmulatedInternet
from tests.adversaries import dishonest_peer
from tests.adversaries.identity_attacks import IDENTITY_ATTACKS
from tests.adversaries.vote_attacks import VOTE_ATTACKS

ATTACKS = (
    "flops", "inflate", "group-inflate", "self-group", "fabricate",
    "nan", "x1000", "sign", "garbage", "lying-reducer", "noisy-reducer", "equivocating-reducer",
    "hiding-reducer", "forged-state",
    "rogue-progress", "silent", "copy", *IDENTITY_ATTACKS, *VOTE_ATTACKS,
)  # fmt: skip
AVERAGING_ATTACKS = (
    *dishonest_peer.POISONS,
    "lying-reducer",
    "noisy-reducer",
    "equivocating-reducer",
    "hiding-reducer",
)  # caught by naming (or its own signatures), not by the desk
PEERS, ATTACKER, LATE = 6, 5, 4


HONEST_WAIT_SECONDS = 1800
PROGRESS_EVERY_SECONDS = 30.0


def _wait_for_honest_peers(swarm: LocalSwarm, honest: list[int], rounds: int) -> None:
    """Wait (bounded) for the honest peers to leave, which they do once the swarm committed its
    rounds; a line every half minute says how far each has come."""
    deadline = time.monotonic() + HONEST_WAIT_SECONDS
    next_line = time.monotonic() + PROGRESS_EVERY_SECONDS
    while time.monotonic() < deadline:
        if all(swarm.procs[f"peer-{i}"].poll() is not None for i in honest):
            return
        if time.monotonic() >= next_line:
            done = [sum(1 for r in swarm.rounds(i) if r.get("committed")) for i in honest]
            print(f"   rounds committed, honest peers: {' '.join(map(str, done))} of {rounds}", flush=True)
            next_line += PROGRESS_EVERY_SECONDS
        time.sleep(1.0)
    raise TimeoutError(f"honest peers still running after {HONEST_WAIT_SECONDS} s")


def run(
    out: Path,
    name: str,
    attack: str | None,
    rounds: int,
    robust: bool = True,
    scenario: Scenario | None = None,
    sync: str = "every-step",
    inner_steps: int = 5,
    commit: str = "board",
) -> dict:
    """One swarm (on ``scenario``'s emulated internet, or on 127.0.0.1); the measurements of its
    attacker (if any) and of its honest peers."""
    run_dir = out / name
    options = SwarmOptions(
        peers=PEERS, rounds=rounds, run_dir=run_dir, target_samples=384, batch_size=32, subnets=2,
        width_mult="0.25", head_channels=64, until_swarm_round=True,
        extra_toml="" if robust else "robust_averaging = false\n", sync=sync, inner_steps=inner_steps,
        commit=commit,
    )  # fmt: skip
    internet = EmulatedInternet(scenario, run_dir) if scenario is not None else None
    placement = [site.name for site in scenario.sites for _ in range(site.peers)] if scenario else None
    swarm = LocalSwarm(options, internet, placement)
    honest = [i for i in range(PEERS) if not (attack and i == ATTACKER)]
    started = time.monotonic()
    try:
        if internet is not None:
            internet.start()
        swarm.start_aggregator(extra_args=("--audit-fraction", "0.1"))
        late = attack == "forged-state"
        for i in range(PEERS):
            if late and i == LATE:
                continue
            command = dishonest_peer.command(attack) if attack and i == ATTACKER else None
            swarm.start_peer(i, command=command)
        if late:  # an honest newcomer, once the swarm has committed a few rounds: it must catch up
            deadline = time.monotonic() + 600
            while len(swarm.rounds(0)) < 3 and time.monotonic() < deadline:
                time.sleep(1.0)
            swarm.start_peer(LATE)
        _wait_for_honest_peers(swarm, honest, rounds)
        swarm.stop([f"peer-{ATTACKER}"])  # if it is still there (a silent one waits to be stopped)
        swarm.stop(["aggregator"], grace=AGGREGATOR_GRACE_SECONDS)  # its last rounds and audits
    except KeyboardInterrupt:
        print(
            f"   stopping {name}: its processes are stopped (seconds), then the emulated internet removed",
            flush=True,
        )
        raise
    finally:
        with stop_signals_held():  # bounded, and a further Ctrl-C must not leave namespaces behind
            try:
                swarm.close()
            finally:
                if internet is not None:
                    internet.close()
    wall = time.monotonic() - started
    summary = summarise(swarm, wall)
    measured = dict(
        name=name,
        wall=wall,
        accuracy=summary.get("accuracy", {}),
        round_seconds=_mean([r["seconds"] for i in honest for r in swarm.rounds(i) if r.get("committed")]),
        committed=min(sum(1 for r in swarm.rounds(i) if r.get("committed")) for i in honest),
        max_roster=max((r.get("roster", 0) for i in honest for r in swarm.rounds(i)), default=0),
    )
    # The late joiner of forged-state misses the rounds before it came by design: the attacker is
    # compared with the honest peers that were there from the start.
    measured |= _credits(swarm, [i for i in honest if not (attack == "forged-state" and i == LATE)])
    if attack:
        measured["caught"] = _caught(swarm, attack)
    if attack == "forged-state":
        log = (swarm.peer_dir(LATE) / "log.txt").read_text()
        measured["forged_refused"] = log.count("no aggregator anchored: not loaded")
    (out / f"{name}.json").write_text(json.dumps(measured, indent=2) + "\n")
    return measured


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _key(swarm: LocalSwarm, i: int) -> str:
    return Identity.load(swarm.peer_dir(i) / "identity.key").public_key_hex


def _credits(swarm: LocalSwarm, honest: list[int]) -> dict:
    with LedgerStore.open(swarm.dir / "aggregator" / "ledger.sqlite", readonly=True) as store:
        rewards = compute_rewards((d for _, d in store.entries()), store.log_public_key)
    by_key = {p.public_key: p.credits for p in rewards.peers}
    return dict(
        honest_credit=_mean([by_key.get(_key(swarm, i), 0) for i in honest]),
        attacker_credit=by_key.get(_key(swarm, ATTACKER), 0),
    )


# what an honest peer logs when its members' reports convict a reducer (peer.commit.waits)
EQUIVOCATION_LINE = r"attempt (\d+): averaging aborted.*reducer (\w{8}) sent different signed proofs"
# what an honest peer logs when it hears a key vote twice in an attempt (peer.commit.certified)
VOTE_EQUIVOCATION_LINE = r"attempt (\d+): peer (\w{8}) voted for \w+ and \w+ in one attempt"


def _caught(swarm: LocalSwarm, attack: str) -> str:
    """Where the attack was first caught (a round or an attempt), or "-" if it never was."""
    if attack in IDENTITY_ATTACKS or attack in ("far-attempt-votes", "forged-votes"):
        return "-"  # forgeries: did they move anything the honest peers count?
    if attack == "equivocating-votes":
        me = _short_id(swarm, ATTACKER)
        attempts = [
            int(m.group(1))
            for i in range(PEERS)
            if i != ATTACKER and (swarm.peer_dir(i) / "log.txt").exists()
            for m in re.finditer(VOTE_EQUIVOCATION_LINE, (swarm.peer_dir(i) / "log.txt").read_text())
            if m.group(2) == me
        ]
        return f"named in attempt {min(attempts)}" if attempts else "never named"
    if attack in AVERAGING_ATTACKS:
        me = _short_id(swarm, ATTACKER)
        attempts = [
            int(m.group(1))
            for i in range(PEERS)
            if i != ATTACKER and (swarm.peer_dir(i) / "log.txt").exists()
            for pattern in (r"attempt (\d+): values of (.*) were outliers", EQUIVOCATION_LINE)
            for m in re.finditer(pattern, (swarm.peer_dir(i) / "log.txt").read_text())
            if me in m.group(2).split(", ")
        ]  # fmt: skip
        named = f"named in attempt {min(attempts)}" if attempts else "never named"
        refused = _refused_rounds(swarm)
        return f"{named}; receipts refused from round {min(refused)}" if refused else named
    rounds = _refused_rounds(swarm)
    key = _key(swarm, ATTACKER)
    with LedgerStore.open(swarm.dir / "aggregator" / "ledger.sqlite", readonly=True) as store:
        entries = [parse_sealed(d, (ContributionReceipt, Revocation)).record for _, d in store.entries()]
    for record in entries:
        if isinstance(record, Revocation):
            target = entries[record.entry_index]
            if isinstance(target, ContributionReceipt) and target.public_key == key:
                rounds.append(target.round)
    return f"round {min(rounds)}" if rounds else "-"


def _short_id(swarm: LocalSwarm, i: int) -> str:
    """The last 8 characters of peer ``i``'s id, as the peers' logs name it."""
    found = re.search(r"peer (\w{8}) \(", (swarm.peer_dir(i) / "log.txt").read_text())
    return found.group(1) if found else "?"


def _refused_rounds(swarm: LocalSwarm) -> list[int]:
    """The rounds of the attacker's receipts the aggregator refused."""
    rounds = []
    for path in (swarm.peer_dir(ATTACKER) / "receipts" / "rejected").glob("*.receipt"):
        try:
            rounds.append(parse_sealed(path.read_bytes(), ContributionReceipt).record.round)
        except ValueError:
            continue
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument(
        "--attacks", default="all", help="all, or a comma-separated list of " + ", ".join(ATTACKS)
    )
    parser.add_argument("--out", type=Path, default=Path("red-team-runs"))
    parser.add_argument("--no-plain", action="store_true", help="skip the plain-mean honest swarm")
    parser.add_argument(
        "--clean-from", type=Path, default=None,
        help="take the clean swarm from an earlier run's --out folder (same machine) instead of running it",
    )  # fmt: skip
    parser.add_argument("--sites", type=int, default=0, help="run on an emulated internet of this many sites")
    parser.add_argument("--uplink", default="50mbit", help="each site's uplink (tc's notation)")
    parser.add_argument("--downlink", default="50mbit", help="each site's downlink")
    parser.add_argument("--delay", type=float, default=20.0, help="one-way delay, site to core, ms")
    parser.add_argument("--sync", choices=("every-step", "outer"), default="every-step")
    parser.add_argument("--inner-steps", type=int, default=5, help="with --sync outer: rounds per outer step")
    parser.add_argument(
        "--commit", choices=("board", "certificates"), default="board",
        help="what decides the swarms' rounds (the vote attacks need certificates)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.inner_steps < 1:
        sys.exit("red_team: --inner-steps must be at least 1")
    scenario = None
    if args.sites:
        try:
            link = LinkProfile(parse_rate(args.uplink), parse_rate(args.downlink), args.delay)
            scenario = uniform_scenario(args.sites, PEERS, link)
            require_privileges()
        except (RateError, ScenarioError, TestbedError) as e:
            sys.exit(f"red_team: {e}")
    attacks = ATTACKS if args.attacks == "all" else tuple(a for a in args.attacks.split(",") if a)
    unknown = [a for a in attacks if a not in ATTACKS]
    if unknown:
        sys.exit(f"unknown attack(s): {', '.join(unknown)} (choose from {', '.join(ATTACKS)})")
    votes = [a for a in attacks if a in VOTE_ATTACKS]
    if votes and args.commit != "certificates" and args.attacks != "all":
        sys.exit(f"red_team: {', '.join(votes)} attack commit certificates; add --commit certificates")
    if args.commit != "certificates" and votes:
        print(
            f"red_team: {', '.join(votes)} left out: they attack commit certificates (--commit certificates)"
        )
        attacks = tuple(a for a in attacks if a not in VOTE_ATTACKS)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"$ python -m benchmarks.red_team {' '.join(sys.argv[1:])}")
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores", flush=True)
    if scenario is not None:
        print(
            f"emulated internet: {args.sites} sites, {args.uplink} up / {args.downlink} down, {args.delay:g} ms one way"
        )
    if args.sync == "outer":
        print(f"outer steps every {args.inner_steps} rounds; each round an inner step inside the cohort")
    print(f"rounds decided by: {args.commit}")
    runs: dict[str, dict] = {}
    if args.clean_from is not None:
        try:
            runs["clean"] = json.loads((args.clean_from / "clean.json").read_text())
        except (OSError, ValueError) as e:
            sys.exit(f"red_team: --clean-from: no clean run in {args.clean_from} ({e})")
    names = (*(() if "clean" in runs else ("clean",)), *(() if args.no_plain else ("plain",)), *attacks)
    try:
        with stop_signals_interrupt():  # Ctrl-C or SIGTERM: the current swarm is stopped and removed
            for n, name in enumerate(names, 1):
                print(f"== {name} ({n} of {len(names)})", flush=True)
                attack = None if name in ("clean", "plain") else name
                runs[name] = run(
                    args.out, name, attack, args.rounds, robust=name != "plain", scenario=scenario,
                    sync=args.sync, inner_steps=args.inner_steps, commit=args.commit,
                )  # fmt: skip
                print(f"   {runs[name]['wall']:.0f} s", flush=True)
    except KeyboardInterrupt:
        if "clean" in runs:
            print_table(runs)
        sys.exit(f"red_team: interrupted after {len(runs)} swarm(s); nothing left running")
    print_table(runs)


def print_table(runs: dict[str, dict]) -> None:
    """The finished swarms side by side with the clean one (which must be among them)."""
    clean = runs["clean"]
    print(f"\nload average after: {os.getloadavg()}")
    print(
        "attack | caught | attacker credit / honest | largest pp | smallest pp | honest round s (x clean) | rounds"
        " | largest honest roster"
    )
    for name, m in runs.items():
        acc, ref = m["accuracy"], clean["accuracy"]
        gap = {
            k: 100 * (acc.get(k, float("nan")) - ref.get(k, float("nan"))) for k in ("largest", "smallest")
        }
        ratio = m["attacker_credit"] / m["honest_credit"] if m.get("honest_credit") else float("nan")
        extra = f" (forged state refused {m['forged_refused']}x)" if "forged_refused" in m else ""
        print(
            f"{name} | {m.get('caught', '')}{extra} | {ratio:.2f} | {gap['largest']:+.1f} | {gap['smallest']:+.1f} | "
            f"{m['round_seconds']:.1f} ({m['round_seconds'] / clean['round_seconds']:.2f}) | {m['committed']}"
            f" | {m.get('max_roster', '?')}"
        )


if __name__ == "__main__":
    main()
