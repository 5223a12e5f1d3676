// The cbgp console: plain script, no build step.  Talks to the gateway's REST API and follows one query's
// answers over server-sent events (EventSource cannot send headers, so the token goes as ?access_token=).
"use strict";
const $ = (id) => document.getElementById(id);
const state = { selected: null, source: null, rows: new Map(), vars: [], series: [], count: 0 };

const tokenInput = $("token");
// `make run` opens the console as /#token=...: the fragment never reaches a server; kept in this browser only.
const fromUrl = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromUrl) { localStorage.setItem("cbgp-token", fromUrl); history.replaceState(null, "", location.pathname); }
tokenInput.value = localStorage.getItem("cbgp-token") || "";
tokenInput.addEventListener("change", () => { localStorage.setItem("cbgp-token", tokenInput.value); refresh(); });

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (tokenInput.value) h["Authorization"] = "Bearer " + tokenInput.value;
  return h;
}
async function api(method, path, body, contentType) {
  const init = { method, headers: headers(body !== undefined ? { "Content-Type": contentType || "application/json" } : {}) };
  if (body !== undefined) init.body = contentType ? body : JSON.stringify(body);
  const response = await fetch(path, init);
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  return { status: response.status, data };
}

function termText(t) {
  if (!t) return "";
  if (t.type === "uri") return "<" + t.value + ">";
  if (t.type === "bnode") return "_:" + t.value;
  let s = JSON.stringify(t.value);
  if (t["xml:lang"]) s += "@" + t["xml:lang"]; else if (t.datatype) s += "^^<" + t.datatype + ">";
  return s;
}
function keyOf(binding) {
  return JSON.stringify(Object.keys(binding).sort().map((k) => [k, binding[k]]));
}
function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

// ---------------------------------------------------------------- fleet and queries

async function refreshFleet() {
  const { status, data } = await api("GET", "/fleet");
  if (status !== 200) { $("fleet").textContent = "fleet: " + (data && data.detail || status); return; }
  const r = data.rates || {}, lag = data.lag || {}, g = data.gateway || {};
  const fmt = (x) => (x === undefined || x === null ? "-" : Math.round(x).toLocaleString());
  $("fleet").innerHTML = "";
  const parts = [["state", data.state, "state-" + data.state], ["raw records/s", fmt(r["updates.raw"])], ["encoded records/s", fmt(r["updates.encoded"])],
    ["answers/s", fmt(r["answers"])], ["ingest lag", fmt(lag.ingest)],
    ["subscribers", (g.subscribers ? g.subscribers.sse + g.subscribers.ws : 0)]];
  for (const [name, value, cls] of parts) {
    const span = document.createElement("span");
    span.innerHTML = name + ": ";
    const b = document.createElement("b");
    b.textContent = value;
    if (cls) b.className = cls;
    span.appendChild(b);
    $("fleet").appendChild(span);
  }
}

async function refreshQueries() {
  let { status, data } = await api("GET", "/queries");
  const body = $("queries").tBodies[0];
  if (status !== 200) { body.innerHTML = ""; body.appendChild(cell("(" + (data && data.detail || status) + ")")); return; }
  const queries = data.queries;
  while (data.next) {  // the gateway lists a page at a time
    ({ status, data } = await api("GET", data.next));
    if (status !== 200) break;
    queries.push(...data.queries);
  }
  body.innerHTML = "";
  for (const q of queries) {
    const tr = document.createElement("tr");
    tr.dataset.id = q.id;
    if (q.id === state.selected) tr.className = "selected";
    for (const v of [q.id, q.status, q["class"], q.placement, q.window || "-", q.version, q.answers, q.current]) tr.appendChild(cell(String(v)));
    const actions = document.createElement("td");
    const view = document.createElement("button");
    view.textContent = "view"; view.className = "view";
    view.onclick = () => select(q.id);
    const drop = document.createElement("button");
    drop.textContent = "unregister"; drop.className = "unregister";
    drop.onclick = async () => {
      const res = await api("DELETE", "/queries/" + encodeURIComponent(q.id));
      $("reg-msg").textContent = res.data ? (res.data.status || "") + ": " + (res.data.message || res.data.detail) : res.status;
      refreshQueries();
    };
    actions.append(view, " ", drop);
    tr.appendChild(actions);
    body.appendChild(tr);
  }
  if (state.selected && !data.queries.some((q) => q.id === state.selected)) $("sel-info").textContent = "(unregistered)";
}

function refresh() { refreshFleet(); refreshQueries(); }

$("reg-button").onclick = async () => {
  const id = $("reg-id").value.trim(), sparql = $("reg-sparql").value;
  $("reg-msg").textContent = "registering ...";
  const res = await api("POST", "/queries", { id, sparql });
  const d = res.data || {};
  const where = d.line ? " (line " + d.line + ", column " + d.column + ")" : "";
  $("reg-msg").textContent = (d.status || res.status) + ": " + (d.message || d.detail || "") + where;
  if (res.status === 201) { await refreshQueries(); select(id); }
};

$("upd-button").onclick = async () => {
  $("upd-msg").textContent = "publishing ...";
  const res = await api("POST", "/update", $("upd-text").value, "application/sparql-update");
  $("upd-msg").textContent = res.status === 200 ? "published (" + res.data.published_bytes + " bytes)" : "error: " + ((res.data && res.data.detail) || res.status);
};

// ---------------------------------------------------------------- one query's answers

function select(id) {
  if (state.source) state.source.close();
  state.selected = id; state.rows = new Map(); state.series = []; state.count = 0; state.since = Date.now();
  $("sel-id").textContent = id;
  $("answers").tBodies[0].innerHTML = "";
  $("deltas").tBodies[0].innerHTML = "";
  api("GET", "/queries/" + encodeURIComponent(id)).then(({ status, data }) => {
    if (status !== 200) return;
    state.vars = data.projected || [];
    $("sel-info").textContent = data["class"] + ", " + data.placement + ", version " + data.version;
    const head = $("answers-head");
    head.innerHTML = "";
    head.appendChild(cell(""));
    for (const v of state.vars) head.appendChild(cell("?" + v));
    head.appendChild(cell("n"));
    let url = "/queries/" + encodeURIComponent(id) + "/answers?from=1";
    if (tokenInput.value) url += "&access_token=" + encodeURIComponent(tokenInput.value);
    const source = new EventSource(url);
    state.source = source;
    source.addEventListener("answer", (e) => onAnswer(JSON.parse(e.data)));
    source.addEventListener("end", () => { source.close(); setTimeout(() => select(id), 500); });
    refreshQueries();
  });
}

function onAnswer(a) {
  const key = keyOf(a.binding);
  const body = $("answers").tBodies[0];
  let entry = state.rows.get(key);
  if (a.sign === "+") {
    state.count += 1;
    if (entry) { entry.count += 1; entry.tr.lastChild.textContent = a.n; }
    else {
      const tr = document.createElement("tr");
      tr.dataset.key = key;
      tr.appendChild(cell("+", "plus"));
      for (const v of state.vars) tr.appendChild(cell(termText(a.binding[v]), "term"));
      tr.appendChild(cell(String(a.n)));
      tr.className = "added";
      body.appendChild(tr);
      setTimeout(() => { if (tr.className === "added") tr.className = ""; }, 1500);
      entry = { tr, count: 1 };
      state.rows.set(key, entry);
    }
  } else if (entry) {
    state.count -= 1;
    entry.count -= 1;
    if (entry.count <= 0) {
      state.rows.delete(key);
      const tr = entry.tr;
      tr.className = "removed";
      tr.firstChild.textContent = "-"; tr.firstChild.className = "minus";
      setTimeout(() => tr.remove(), 1200);
    }
  }
  $("answers-count").textContent = state.count + " current answer(s); last n = " + a.n;
  const d = document.createElement("tr");
  d.appendChild(cell(a.sign, a.sign === "+" ? "plus" : "minus"));
  d.appendChild(cell("#" + a.n));
  d.appendChild(cell(state.vars.filter((v) => a.binding[v]).map((v) => "?" + v + "=" + termText(a.binding[v])).join(" ") || "(no variable bound)", "term"));
  const deltas = $("deltas").tBodies[0];
  deltas.insertBefore(d, deltas.firstChild);
  while (deltas.rows.length > 50) deltas.deleteRow(-1);
  // x: when the answer was produced (the history replayed on subscribing lands where it belongs); latency only
  // for answers produced since this page subscribed (a replayed answer's age is not a delivery latency)
  const live = !a.snapshot && a.produced_at_ms >= state.since - 1000;
  state.series.push({ t: a.produced_at_ms, count: state.count, latency: Math.max(0, Date.now() - a.produced_at_ms), live });
  if (state.series.length > 600) state.series.shift();
  draw();
}

function draw() {
  const canvas = $("plot"), ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, s = state.series;
  ctx.clearRect(0, 0, w, h);
  if (!s.length) return;
  const t0 = s[0].t, t1 = Math.max(s[s.length - 1].t, t0 + 1000);
  const maxCount = Math.max(1, ...s.map((p) => p.count));
  const live = s.filter((p) => p.live);
  const maxLat = Math.max(10, ...live.map((p) => p.latency));
  const x = (t) => 30 + (w - 70) * (t - t0) / (t1 - t0);
  ctx.strokeStyle = "#4a7bd0"; ctx.lineWidth = 2; ctx.beginPath();
  s.forEach((p, i) => { const y = h - 10 - (h - 20) * p.count / maxCount; i ? ctx.lineTo(x(p.t), y) : ctx.moveTo(x(p.t), y); });
  ctx.stroke();
  ctx.fillStyle = "#d08a4a";
  for (const p of live) ctx.fillRect(x(p.t) - 2, h - 10 - (h - 20) * p.latency / maxLat - 2, 4, 4);
  ctx.fillStyle = "#1d2330"; ctx.font = "11px sans-serif";
  ctx.fillText(String(maxCount), 4, 14); ctx.fillText(maxLat + " ms", w - 60, 14);
}

refresh();
setInterval(refresh, 2000);
