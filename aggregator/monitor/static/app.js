// The dashboard: polls the read-only JSON API every 2 s and redraws. Everything the swarm reports is
// inserted as text (textContent), never as HTML.
"use strict";

const POLL_MS = 2000;
const COLORS = { loss: "#e4572e", largest: "#2563eb", smallest: "#16a34a", throughput: "#7c3aed" };
const rounds = new Map(); // round -> row of /api/rounds
let polls = 0;

const $ = (id) => document.getElementById(id);

function fmt(value, digits) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  return value.toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

function ago(seconds) {
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  return `${(seconds / 3600).toFixed(1)} h ago`;
}

function clock(unixSeconds) {
  return unixSeconds ? new Date(unixSeconds * 1000).toLocaleTimeString() : "–";
}

function cell(row, text, className, title) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  if (title) td.title = title;
  row.appendChild(td);
  return td;
}

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

function showStatus(s) {
  const t = s.task;
  $("task").textContent = t
    ? `task ${t.task_id} · ${t.task} · ${t.mode}-parallel · aggregator ${s.aggregator.fingerprint}`
    : `aggregator ${s.aggregator.fingerprint} · waiting for the task`;
  const r = s.round;
  const total = t ? ` / ${t.total_rounds}` : "";
  $("round").textContent = r.current === null ? "–" : `${r.current}${total}`;
  $("phase").textContent = `${r.phase ? "phase " + r.phase + " · " : ""}${r.activity}`;
  $("round-progress").style.width = `${Math.round(100 * (r.progress || 0))}%`;
  $("round-samples").textContent = r.target ? `${fmt(r.samples, 0)} of ${fmt(r.target, 0)} samples` : "";
  $("peers-online").textContent = String(s.peers_online);
  $("cohort-count").textContent = `${s.cohorts.length} cohort${s.cohorts.length === 1 ? "" : "s"}`;
  $("throughput").textContent = fmt(s.throughput, 1);
  const last = s.last_round;
  $("last-loss").textContent = last ? fmt(last.loss, 4) : "–";
  $("last-round").textContent = last ? `training loss, round ${last.round}` : "training loss";
  const v = s.validation;
  if (v) {
    const pct = v.metric === "accuracy";
    const show = (x) => (pct ? `${fmt(100 * x, 1)}%` : fmt(x, 3));
    $("validation").textContent = `${show(v.largest)} / ${show(v.smallest)}`;
    $("validation-round").textContent = `${v.metric}, largest / smallest, round ${v.round}`;
    $("validation-caption").textContent = `Validation ${v.metric} (largest / smallest sub-network)`;
  }
  const traffic = s.traffic || {};
  $("cross-bytes").textContent = `${fmt((traffic.cross_cohort_bytes || 0) / 1e6, 1)} MB`;
  $("outer-steps").textContent =
    t && t.sync === "outer"
      ? `${traffic.outer_steps || 0} outer step(s), every ${t.inner_steps} rounds, ${t.outer_compression}`
      : "every round's gradient (sync: every-step)";
  const d = s.data;
  $("data-card").hidden = !d;
  if (d) {
    $("data-shards").textContent = `${d.held_by_peers}/${d.shards} shards on peers`;
    $("data-served").textContent =
      `${d.kind}, ${fmt(d.bytes / 1e6, 1)} MB; served: peers ${fmt(d.peer_bytes_served / 1e6, 1)} MB, ` +
      `aggregator ${fmt(d.aggregator_bytes_served / 1e6, 1)} MB`;
  }
  const c = s.checkpoint;
  $("checkpoint").textContent = c ? `round ${c.round}` : "–";
  $("checkpoint-time").textContent = c ? `written ${clock(c.written)}` : "none yet";

  const body = $("cohorts").tBodies[0];
  body.replaceChildren();
  for (const cohort of s.cohorts) {
    const row = body.insertRow();
    cell(row, cohort.cohort || "(none)", "mono");
    cell(row, String(cohort.peers), "num");
    cell(row, fmt(cohort.throughput, 1), "num");
  }
}

function showPeers(data) {
  const body = $("peers").tBodies[0];
  body.replaceChildren();
  for (const p of data.peers) {
    const row = body.insertRow();
    row.dataset.peer = p.peer_id;
    row.className = p.online ? "online" : "offline";
    const dot = document.createElement("span");
    const activity = p.computing ? "computing" : p.averaging ? "averaging" : p.online ? "online" : "offline";
    dot.className = `dot ${activity}`;
    dot.title = activity;
    cell(row, "").appendChild(dot);
    cell(row, p.peer_id.slice(0, 12) + "…", "mono", p.peer_id);
    cell(row, p.fingerprint, "mono", p.public_key);
    cell(row, p.cohort || "–", "mono");
    cell(row, p.device || "–");
    cell(row, fmt(p.throughput, 1), "num");
    cell(row, p.round === null ? "–" : String(p.round), "num");
    cell(row, fmt(p.samples, 0), "num");
    cell(row, fmt(p.loss, 4), "num");
    cell(row, ago(p.seconds_since_seen), "num", clock(p.last_seen));
  }
  $("peers-empty").hidden = data.peers.length > 0;
}

function showRounds(rows) {
  for (const row of rows) rounds.set(row.round, row);
  const all = [...rounds.values()].sort((a, b) => a.round - b.round);
  const withSamples = all.filter((r) => r.samples > 0);
  drawLineChart($("chart-loss"), [
    { name: "loss", color: COLORS.loss, points: withSamples.filter((r) => r.loss !== null).map((r) => [r.round, r.loss]) },
  ], { xLabel: "round" });
  const evaluated = all.filter((r) => r.validation);
  drawLineChart($("chart-validation"), [
    { name: "largest", color: COLORS.largest, points: evaluated.map((r) => [r.round, r.validation.largest]) },
    { name: "smallest", color: COLORS.smallest, points: evaluated.map((r) => [r.round, r.validation.smallest]) },
  ], { xLabel: "round", empty: "waiting for the first evaluated checkpoint" });
  drawLineChart($("chart-throughput"), [
    { name: "samples/s", color: COLORS.throughput, points: withSamples.map((r) => [r.round, r.throughput]) },
  ], { xLabel: "round", yMin: 0 });
}

function showLedger(ledger) {
  const head = $("ledger-head");
  head.replaceChildren();
  const add = (key, value) => {
    const dt = document.createElement("dt");
    dt.textContent = key;
    const dd = document.createElement("dd");
    dd.textContent = value;
    head.append(dt, dd);
  };
  if (!ledger.present) {
    add("ledger", ledger.error ? `unreadable: ${ledger.error}` : "no entries yet");
  } else {
    const h = ledger.head;
    add("origin", h.origin);
    add("size", `${h.size} entries`);
    add("root", h.root);
    const c = h.checkpoint;
    add("checkpoint", c ? `#${c.seq}, ${c.size} entries, signed ${new Date(c.created * 1000).toLocaleString()}` : "none yet");
  }
  const rewards = ledger.rewards;
  const body = $("rewards").tBodies[0];
  body.replaceChildren();
  const peers = rewards ? rewards.peers : [];
  for (const p of peers) {
    const row = body.insertRow();
    cell(row, p.fingerprint, "mono", p.public_key);
    cell(row, p.peer_ids.map((id) => id.slice(0, 12) + "…").join(", "), "mono", p.peer_ids.join("\n"));
    cell(row, p.credits.toExponential(3), "num");
    cell(row, `${fmt(100 * p.share, 2)}%`, "num");
    cell(row, String(p.entries), "num");
    cell(row, String(p.revoked), "num");
  }
  $("rewards-empty").hidden = peers.length > 0;
}

async function showProof() {
  const index = $("proof-index").value;
  const out = $("proof-output");
  try {
    const response = await fetch(`/api/ledger/proof/${encodeURIComponent(index)}`, { cache: "no-store" });
    const data = await response.json();
    out.textContent = response.ok
      ? `entry ${data.index} (${data.kind}) under checkpoint #${data.checkpoint.seq} (size ${data.checkpoint.size}), ` +
        `verified here: ${data.verified}\nleaf ${data.leaf_hash}\nroot ${data.checkpoint.root}\n` +
        data.proof.map((h, i) => `proof[${i}] ${h}`).join("\n")
      : data.error;
  } catch (e) {
    out.textContent = String(e);
  }
}

async function poll() {
  const full = polls % 15 === 0;
  polls += 1;
  const newest = rounds.size ? Math.max(...rounds.keys()) : 0;
  const since = full ? 0 : Math.max(0, newest - 50);
  try {
    const [status, peers, roundRows, ledger] = await Promise.all([
      getJSON("/api/status"),
      getJSON("/api/peers"),
      getJSON(`/api/rounds?since=${since}`),
      getJSON("/api/ledger"),
    ]);
    showStatus(status);
    showPeers(peers);
    showRounds(roundRows.rounds);
    showLedger(ledger);
    $("connection").textContent = `live · ${new Date().toLocaleTimeString()}`;
    $("connection").className = "badge live";
  } catch (e) {
    $("connection").textContent = "offline";
    $("connection").className = "badge off";
    console.error(e);
  }
  setTimeout(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  $("proof-button").addEventListener("click", showProof);
  poll();
});
