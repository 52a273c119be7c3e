// Bookline's live dashboard: polls /v1/cluster and renders it (no framework, no
// external assets). Rates and mean latencies come from the deltas of the cumulative
// totals between two polls; the graphs show the last HISTORY_S seconds, kept for the
// tab in sessionStorage so a reload does not start them again from nothing.
"use strict";

const params = new URLSearchParams(location.search);
const INTERVAL_MS = Math.max(500, Number(params.get("refresh_ms")) || 2000);
const HISTORY_S = 600;
const HISTORY_KEY = "bookline-history";
const history = loadHistory(); // {t, totals, rates}, oldest first
let previous = null; // the last summary, for per-stream rates

function loadHistory() {
  let saved = null;
  try {
    saved = JSON.parse(sessionStorage.getItem(HISTORY_KEY) || "[]");
  } catch (err) {
    // not ours or cut short: the graphs start again rather than the page failing
    console.warn("dashboard: history in sessionStorage unreadable, dropped", err);
  }
  return Array.isArray(saved) ? saved.filter((h) => typeof h?.t === "number") : [];
}

function keepHistory(point) {
  history.push(point);
  while (history.length && history[0].t < point.t - HISTORY_S) history.shift();
  sessionStorage.setItem(HISTORY_KEY, JSON.stringify(history));
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(child ?? ""));
  }
  return node;
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function fmtNum(n, digits = 0) {
  if (n === null || n === undefined || Number.isNaN(n)) return "-";
  return n.toLocaleString(undefined, {maximumFractionDigits: digits});
}

function fmtRate(n) { return n === null ? "-" : `${fmtNum(n, n < 10 ? 1 : 0)}/s`; }

function stateBadge(state) { return el("span", {class: `state ${state}`}, state); }

function diskCell(disk) {
  if (!disk) return el("td", {}, "-");
  const used = disk.used_ratio;
  const width = Math.max(0, Math.min(100, used * 100));
  const level = used >= 0.9 ? "full" : used >= 0.75 ? "high" : "";
  const bar = el("span", {class: "bar"}, el("span", {class: level}));
  bar.firstChild.style.width = `${width}%`;
  return el("td", {"data-used": used.toFixed(4)}, bar, `${(used * 100).toFixed(1)} %`);
}

function fill(tbody, rows, empty, columns) {
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", {class: "empty", colSpan: columns}, empty))]));
}

function rate(now, before, seconds, pick) {
  if (!before || seconds <= 0) return null;
  const d = pick(now) - pick(before);
  return d >= 0 ? d / seconds : null;
}

function meanMs(now, before, count, sum) {
  if (!before) return null;
  const n = now[count] - before[count];
  return n > 0 ? ((now[sum] - before[sum]) / n) * 1000 : null;
}

function renderBookies(data, seconds) {
  const before = new Map((previous?.bookies || []).map((b) => [b.id, b]));
  const rows = data.bookies.map((b) => {
    const prev = before.get(b.id);
    const adds = rate(b, prev, seconds, (x) => x.requests?.ADD?.count ?? 0);
    const reads = rate(b, prev, seconds, (x) => x.requests?.READ?.count ?? 0);
    const down = b.state === "down";
    return el("tr", {"data-bookie": b.id, "data-state": b.state},
      el("td", {}, el("strong", {}, b.id), el("br"), el("span", {class: "note"}, b.address || "")),
      el("td", {}, stateBadge(b.state)),
      el("td", {class: "why"}, b.why),
      el("td", {}, b.registered),
      diskCell(down ? null : b.disk),
      el("td", {class: "num"}, down || !b.disk ? "-" : fmtBytes(b.disk.free_bytes)),
      el("td", {class: "num"}, down ? "-" : fmtRate(adds)),
      el("td", {class: "num"}, down ? "-" : fmtRate(reads)),
      el("td", {class: "num"}, down ? "-" : fmtNum(b.connections)));
  });
  fill(document.querySelector("#bookies tbody"), rows, "no bookies known", 9);
}

function renderProxies(data) {
  const rows = data.proxies.map((p) => el("tr", {"data-proxy": p.id, "data-state": p.state},
    el("td", {}, el("strong", {}, p.id)), el("td", {}, p.kind), el("td", {}, stateBadge(p.state)),
    el("td", {class: "why"}, p.why), el("td", {}, el("a", {href: p.url}, p.url))));
  fill(document.querySelector("#proxies tbody"), rows, "no proxies registered", 5);
}

function renderLogs(kind, data, seconds, columns) {
  const before = new Map((previous?.[kind]?.items || []).map((s) => [s.name, s]));
  const part = data[kind];
  const rows = part.items.map((s) => {
    if (s.error) {
      return el("tr", {"data-name": s.name}, el("td", {}, s.name), el("td", {class: "why", colSpan: columns - 1}, s.error));
    }
    const r = rate(s, before.get(s.name), seconds, (x) => x.end_offset ?? 0);
    const cells = [el("td", {}, s.name)];
    if (kind === "topics") cells.push(el("td", {class: "num"}, fmtNum(s.partitions)));
    cells.push(el("td", {class: "num"}, fmtNum(s.segments)), el("td", {class: "num"}, fmtNum(s.records)),
      el("td", {class: "num"}, fmtBytes(s.size_bytes)), el("td", {class: "num"}, fmtRate(r)));
    return el("tr", {"data-name": s.name}, ...cells);
  });
  fill(document.querySelector(`#${kind} tbody`), rows, `no ${kind}`, columns);
  document.getElementById(`${kind}-note`).textContent =
    part.total > part.items.length ? `(${part.items.length} of ${part.total} shown)` : `(${part.total})`;
}

function renderGroups(data) {
  const rows = data.groups.map((g) => el("tr", {"data-group": g.group},
    el("td", {}, g.group), el("td", {class: "num"}, fmtNum(g.members)),
    el("td", {class: "num"}, fmtNum(g.generation)), el("td", {class: "num"}, fmtNum(g.lag_records))));
  fill(document.querySelector("#groups tbody"), rows, "no groups coordinated right now", 4);
}

function renderErrors(data) {
  const list = document.getElementById("errors");
  const items = data.recent_errors.map((e) => el("li", {class: e.level},
    el("span", {class: "src"}, `${new Date(e.time_ms).toLocaleTimeString()} ${e.service} ${e.id} ${e.level} `),
    e.message));
  list.replaceChildren(...(items.length ? items : [el("li", {class: "empty"}, "none")]));
}

// The top of a graph's scale: 1, 2 or 5 times a power of ten, above every value.
function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((f) => f * power).find((m) => m >= value);
}

function svgNode(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  Object.entries(attrs).forEach(([k, v]) => node.setAttribute(k, v));
  if (text !== undefined) node.textContent = text;
  return node;
}

// A graph of series [{name, color, points: [{t, v}]}] over the last HISTORY_S seconds
// to `now`, with a value axis (0, half, top, in `unit`) and a time axis.
function drawGraph(id, series, unit, now) {
  const svg = document.getElementById(id);
  const width = 600, height = 160, left = 50, right = 10, top = 10, bottom = 22;
  const plotW = width - left - right, plotH = height - top - bottom;
  const values = series.flatMap((s) => s.points.map((p) => p.v).filter((v) => v !== null));
  const max = niceMax(Math.max(0, ...values));
  const x = (t) => left + plotW * (1 - (now - t) / HISTORY_S);
  const y = (v) => top + plotH * (1 - v / max);
  const nodes = [];
  for (const f of [0, 0.5, 1]) {
    nodes.push(svgNode("line", {x1: left, x2: width - right, y1: y(f * max), y2: y(f * max), class: f ? "grid" : "axis-line"}));
    nodes.push(svgNode("text", {x: left - 4, y: y(f * max) + 4, "text-anchor": "end", class: "tick-y", "data-value": f * max},
      `${fmtNum(f * max, 2)}${f === 1 ? ` ${unit}` : ""}`));
  }
  nodes.push(svgNode("line", {x1: left, x2: left, y1: top, y2: top + plotH, class: "axis-line"}));
  for (let ago = HISTORY_S; ago >= 0; ago -= HISTORY_S / 4) {
    const label = ago ? `-${fmtNum(ago / 60, 1)} min` : "now";
    const anchor = ago === HISTORY_S ? "start" : ago ? "middle" : "end";
    nodes.push(svgNode("text", {x: x(now - ago), y: height - 6, "text-anchor": anchor, class: "tick-x", "data-ago-s": ago}, label));
  }
  for (const s of series) {
    const coords = s.points.filter((p) => p.v !== null && now - p.t <= HISTORY_S)
      .map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`);
    if (coords.length) {
      nodes.push(svgNode("polyline", {points: coords.join(" "), stroke: s.color, "data-series": s.name}));
    }
  }
  svg.replaceChildren(...nodes);
  const last = series.map((s) => `${s.name} ${fmtNum(s.points.at(-1)?.v ?? null, 2)}`).join(" · ");
  document.getElementById(id.replace("graph", "axis")).textContent = `now: ${last}`;
}

function renderGraphs() {
  const pick = (key) => history.map((h) => ({t: h.t, v: h.rates?.[key] ?? null}));
  const now = history.at(-1)?.t ?? 0;
  const css = getComputedStyle(document.documentElement);
  const color = (v) => css.getPropertyValue(v).trim();
  drawGraph("graph-throughput", [
    {name: "written", color: color("--w"), points: pick("written")},
    {name: "served", color: color("--r"), points: pick("served")},
    {name: "bookie ADDs", color: color("--b"), points: pick("adds")},
  ], "/s", now);
  drawGraph("graph-latency", [
    {name: "write", color: color("--w"), points: pick("writeMs")},
    {name: "read", color: color("--r"), points: pick("readMs")},
    {name: "ADD", color: color("--b"), points: pick("addMs")},
  ], "ms", now);
}

function setCard(id, text, bad) {
  const card = document.getElementById(id);
  card.textContent = text;
  card.classList.toggle("bad", Boolean(bad));
}

// Autorecovery (the elected auditor, re-replication on or paused) and ZooKeeper (this
// proxy's session, each server's ruok and mode).
function renderRecovery(data) {
  const recovery = data.autorecovery || {};
  setCard("card-auditor", recovery.auditor ?? "none", !recovery.auditor);
  const enabled = recovery.replication_enabled;
  setCard("card-replication", enabled === null || enabled === undefined ? "?" : enabled ? "enabled" : "paused", enabled === false);
  const zk = data.zookeeper || {servers: []};
  setCard("card-zk", (zk.session || "?").toLowerCase(), zk.session !== "CONNECTED");
  const rows = zk.servers.map((z) => el("tr", {"data-zk": z.address, "data-ok": String(z.ok)},
    el("td", {}, z.address), el("td", {}, stateBadge(z.ok ? "ok" : "down")),
    el("td", {}, z.mode ?? "no answer to srvr")));
  fill(document.querySelector("#zookeeper tbody"), rows, "no servers in the connect string", 3);
}

function render(data) {
  const t = data.time_ms / 1000;
  const last = history.at(-1);
  const seconds = last ? t - last.t : 0;
  const totals = data.totals;
  const before = last?.totals;
  const rates = before && seconds > 0 ? {
    written: rate(totals, before, seconds, (x) => x.records_written),
    served: rate(totals, before, seconds, (x) => x.records_served),
    adds: rate(totals, before, seconds, (x) => x.bookie_adds),
    writeMs: meanMs(totals, before, "write_count", "write_seconds"),
    readMs: meanMs(totals, before, "read_count", "read_seconds"),
    addMs: meanMs(totals, before, "bookie_adds", "bookie_add_seconds"),
  } : null;
  if (!last || seconds > 0) keepHistory({t, totals, rates});
  const up = data.bookies.filter((b) => b.state !== "down").length;
  const cardBookies = document.getElementById("card-bookies");
  cardBookies.textContent = `${up} / ${data.bookies.length}`;
  cardBookies.classList.toggle("bad", up < data.bookies.length);
  const ur = document.getElementById("card-ur");
  ur.textContent = data.underreplicated_ledgers ?? "?";
  ur.classList.toggle("bad", (data.underreplicated_ledgers || 0) > 0);
  document.getElementById("card-writes").textContent = rates ? `${fmtRate(rates.written)}` : fmtNum(totals.records_written);
  document.getElementById("card-reads").textContent = rates ? `${fmtRate(rates.served)}` : fmtNum(totals.records_served);
  const down = data.bookies.length - up;
  document.getElementById("summary").textContent =
    `namespace ${data.namespace} · ${data.bookies.length} bookies` + (down ? ` (${down} down)` : "") +
    ` · ${data.proxies.length} proxies · ${data.streams.total} streams · ${data.topics.total} topics`;
  renderBookies(data, seconds);
  renderProxies(data);
  renderLogs("streams", data, seconds, 5);
  renderLogs("topics", data, seconds, 6);
  renderGroups(data);
  renderErrors(data);
  renderRecovery(data);
  renderGraphs();
  previous = data;
}

// With auth on (docs/security.md) /v1/cluster wants an admin token: open the page as
// /dashboard#token=TOKEN. A fragment never reaches a server or its logs; the token is
// kept for this tab (sessionStorage) and removed from the address bar.
function dashboardToken() {
  const found = /(?:^|&)token=([^&]+)/.exec(location.hash.slice(1));
  if (found) {
    sessionStorage.setItem("bookline-token", decodeURIComponent(found[1]));
    window.history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("bookline-token");
}

async function poll() {
  const updated = document.getElementById("updated");
  try {
    const token = dashboardToken();
    const headers = token ? {Authorization: `Bearer ${token}`} : {};
    const resp = await fetch("/v1/cluster", {cache: "no-store", headers});
    if (resp.status === 401 || resp.status === 403) {
      // the proxy answered: it wants a token (401) or a better one (403)
      const need = resp.status === 401 ? "needs an admin token" : "refused this token (not an admin's)";
      updated.textContent = `this dashboard ${need}: open /dashboard#token=<admin token>`;
      updated.classList.add("stale");
      return;
    }
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const data = await resp.json();
    render(data);
    updated.textContent = `updated ${new Date(data.time_ms).toLocaleTimeString()}`;
    updated.classList.remove("stale");
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  } catch (err) {
    updated.textContent = `read proxy not answering (${err.message}); retrying`;
    updated.classList.add("stale");
  } finally {
    setTimeout(poll, INTERVAL_MS);
  }
}

document.getElementById("interval").textContent = String(INTERVAL_MS / 1000);
poll();
