// labctl dashboard: the token kept for this tab, the POST buttons, and the live page's stream.
"use strict";

function token() {
  const box = document.getElementById("token");
  if (box && box.value) sessionStorage.setItem("labctl-token", box.value);
  return sessionStorage.getItem("labctl-token") || "";
}

document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("token");
  if (box) box.value = sessionStorage.getItem("labctl-token") || "";
  for (const button of document.querySelectorAll("button.act")) {
    button.addEventListener("click", async () => {
      const shown = document.getElementById("action-error");
      button.disabled = true;
      const answer = await fetch(button.dataset.post, { method: "POST", headers: { "X-Labctl-Token": token() } });
      const body = await answer.json().catch(() => ({}));
      if (!answer.ok && shown) { shown.textContent = body.error || answer.statusText; shown.hidden = false; }
      else location.reload();
      button.disabled = false;
    });
  }
  for (const link of document.querySelectorAll("a.slow")) {
    link.addEventListener("click", () => { const p = document.getElementById("progress"); if (p) p.hidden = false; });
  }
});

function ms(ns) {
  if (ns === null || ns === undefined) return "";
  return ns >= 1e9 ? (ns / 1e9).toFixed(3) + " s" : (ns / 1e6).toFixed(1) + " ms";
}

const MARKS = ["t0", "t1", "t2", "t3", "t4", "t5"];

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function showState(s) {
  const set = (id, text) => { document.getElementById(id).textContent = text; };
  const status = document.getElementById("status");
  status.textContent = s.status + (s.error ? ": " + s.error : "");
  status.className = "status status-" + s.status;
  set("reconfig", s.reconfig === null ? "–" : String(s.reconfig + 1));
  set("total", s.total === null ? "?" : String(s.total));
  set("phase", s.phase || "–");
  set("lag", ms(s.lag_ns) || "–");
  set("lagmax", ms(s.lag_max_ns) || "–");
  const skipped = Object.entries(s.skipped || {});
  set("skipped", skipped.length ? skipped.map(([k, v]) => k + " " + v).join(", ") : "0");
  set("events", String(s.events));
  const body = document.querySelector("#ports tbody");
  body.replaceChildren();
  for (const p of s.ports) {
    const row = body.insertRow();
    row.dataset.port = p.source;
    cell(row, p.host + "/" + p.port);
    cell(row, p.peer || "");
    const dbm = s.rx_dbm[p.source];
    cell(row, dbm === null || dbm === undefined ? "dark" : dbm.toFixed(1), "rx");
    for (const m of MARKS) {
      const at = p.marks[m];
      cell(row, at === undefined ? "…" : (m === "t0" ? "✓" : ms(at)), (at === undefined ? "waiting " : "reached ") + m);
    }
  }
  const clocks = Object.entries(s.clocks || {});
  document.getElementById("clocks-box").hidden = clocks.length === 0;
  const clockBody = document.querySelector("#clocks tbody");
  clockBody.replaceChildren();
  for (const [host, c] of clocks) {
    const row = clockBody.insertRow();
    row.dataset.host = host;
    cell(row, host);
    cell(row, c.shared ? "0 (same clock)" : ms(c.offset_ns));
    cell(row, ms(c.uncertainty_ns));
    cell(row, ms(c.rtt_min_ns));
    cell(row, c.via || "");
  }
  const warnings = document.getElementById("warnings");
  warnings.replaceChildren(...s.warnings.map((w) => { const li = document.createElement("li"); li.textContent = w; return li; }));
  document.body.dataset.seq = String(s.seq);
}

function addRows(rows) {
  const body = document.querySelector("#rows tbody");
  for (const r of rows) {
    const row = body.insertRow();
    cell(row, String(r.reconfig));
    cell(row, r.phase || "");
    cell(row, r.port);
    for (const m of ["t1", "t2", "t3", "t4", "t5"]) cell(row, ms(r.marks[m]), m);
  }
  document.getElementById("nrows").textContent = String(body.rows.length);
}

function showEnd(end) {
  const box = document.getElementById("end");
  const skipped = Object.entries(end.ticks_skipped || {}).map(([k, v]) => k + " " + v).join(", ");
  const lag = end.loop_lag || {};
  box.textContent = "Run ended: " + (end.status || "?") + ". Skipped ticks: " + (skipped || "none") +
    ". Loop lag p99 " + (ms(lag.p99) || "–") + ", max " + (ms(lag.max) || "–") + ".";
  box.hidden = false;
}

function liveRun(run) {
  const source = new EventSource("/live/" + encodeURIComponent(run) + "/stream");
  const error = document.getElementById("stream-error");
  source.addEventListener("state", (e) => {
    error.hidden = true;
    showState(JSON.parse(e.data));
  });
  source.addEventListener("rows", (e) => addRows(JSON.parse(e.data)));
  source.addEventListener("end", (e) => { showEnd(JSON.parse(e.data)); source.close(); });
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) return;
    error.textContent = "The stream was interrupted; reconnecting (if this stays, check that the server still runs).";
    error.hidden = false;
  };
  // a reconnect replays the snapshot: start the table again
  source.onopen = () => { document.querySelector("#rows tbody").replaceChildren(); };
}
