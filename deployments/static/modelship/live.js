// The live admin: keeps the deployment list and a deployment's page current from the
// /ws/deployments socket (ondemand/live.py), and follows an engine's log through the API's
// server-sent events, with a pause. Cells to keep current carry data-live="<field>" and
// data-id="<deployment id>".
(function () {
  "use strict";
  const LOG_LINES = 2000; // lines the log panel keeps (and buffers while paused)
  const RUNNING = ["starting", "ready", "asleep", "stopping"];
  const panel = document.getElementById("live-panel");
  const mine = panel ? Number(panel.dataset.deployment) : null;
  const liveStatus = document.getElementById("live-status");
  let retry = 500;

  function ago(time) {
    if (!time) return "never";
    let s = Math.max(0, Math.floor(Date.now() / 1000 - time));
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60]]) {
      if (s >= size) return Math.floor(s / size) + " " + unit + " ago";
    }
    return s + " s ago";
  }

  // A number as the server's page writes it (Python's float: 8.0, 0.25).
  function gib(value) {
    return Number.isInteger(value) ? value.toFixed(1) : String(value);
  }

  // An on-demand deployment's countdown to its idle stop: from its last request, while it is
  // ready and nothing is in flight (the gateway's timer; the engine's load may hold it longer).
  function idleLeft(json) {
    const row = JSON.parse(json || "{}");
    if (row.state !== "ready") return "— (not running)";
    if (row.inflight) return "— (serving)";
    if (!row.last || !row.timeout) return "after " + Math.round((row.timeout || 0) / 60) + " min without a request";
    const left = Math.max(0, Math.floor(row.last + row.timeout - Date.now() / 1000));
    return "in " + Math.floor(left / 60) + " min " + (left % 60) + " s if no request comes";
  }

  // An engine's address in a narrow column: host and port (display.short_url).
  function shortUrl(url) {
    if (!url || url === "-") return "-";
    const rest = url.includes("://") ? url.split("://")[1] : url;
    return rest.split("/")[0];
  }

  function cells(id, field) {
    return document.querySelectorAll('[data-live="' + field + '"][data-id="' + id + '"]');
  }

  // A cell flashes when a change comes in, not when the first message fills it in.
  function flash(el) {
    if (!el.dataset.seen) {
      el.dataset.seen = "1";
      return;
    }
    el.classList.remove("ms-changed");
    void el.offsetWidth; // restart the animation
    el.classList.add("ms-changed");
  }

  function set(id, field, text) {
    for (const el of cells(id, field)) {
      if (el.textContent !== String(text) || !el.dataset.seen) {
        el.textContent = text;
        flash(el);
      }
    }
  }

  function show(row) {
    for (const el of cells(row.id, "state")) {
      if (el.textContent !== row.label || !el.dataset.seen) flash(el);
      el.textContent = row.label;
      el.style.background = row.colour;
      el.title = row.reason;
    }
    set(row.id, "reason", row.reason);
    const head = row.reason.split("\n")[0];
    set(row.id, "reason_head", head.length > 200 ? head.slice(0, 200) + "…" : head);
    for (const el of document.querySelectorAll('[data-live-reason="' + row.id + '"]')) el.hidden = !row.reason;
    for (const el of cells(row.id, "idle_left")) {
      el.dataset.row = JSON.stringify({ state: row.state, inflight: row.inflight,
        last: row.last_request_at, timeout: row.idle_timeout_s });
      el.textContent = idleLeft(el.dataset.row);
    }
    set(row.id, "mode", row.mode);
    set(row.id, "activity", row.activity);
    set(row.id, "gpus", row.gpus);
    set(row.id, "engine", shortUrl(row.engine));
    for (const el of cells(row.id, "engine")) el.title = row.engine === "-" ? "" : row.engine;
    set(row.id, "state_changed_at", row.state_changed_at);
    set(row.id, "holding_gib", row.holding_gib.toFixed(2));
    for (const el of cells(row.id, "last_request_at")) {
      el.dataset.time = row.last_request_at || "";
      el.textContent = ago(row.last_request_at);
    }
    for (const el of cells(row.id, "state_since")) {
      el.dataset.time = row.state_changed_ts || "";
      el.textContent = row.state_changed_ts ? ago(row.state_changed_ts) : "—";
      el.title = row.state_changed_at;
    }
    if (row.id === mine) log.engine(RUNNING.includes(row.state));
    // A button does something only in its states: enabled as the state changes.
    for (const button of document.querySelectorAll('button[data-states][data-id="' + row.id + '"]')) {
      const acts = button.dataset.states.split(" ").includes(row.state);
      button.disabled = !acts;
      button.title = acts ? "" : "not while it is " + row.state;
    }
  }

  function gone(id) {
    for (const el of document.querySelectorAll('[data-id="' + id + '"]')) {
      const line = el.closest("tr");
      if (line) line.classList.add("ms-gone");
    }
    if (id === mine) setStatus(liveStatus, "removed", false);
  }

  function text(tag, value) {
    const el = document.createElement(tag);
    el.textContent = value;
    return el;
  }

  function showHost(host) {
    const budget = document.getElementById("host-budget");
    if (!budget) return;
    const gpus = host.gpus.length;
    budget.textContent = "Memory: " + gib(host.held_gib) + " of " + gib(host.capacity_gib) +
      " GiB held, " + gib(host.free_gib) + " GiB free (on-demand capacity " +
      gib(host.on_demand_capacity_gib) + " GiB" +
      (gpus ? ", " + gpus + " GPU" + (gpus > 1 ? "s" : "") + ", placed per GPU" : "") + ").";
    const body = document.querySelector("#host-gpus tbody");
    if (!body) return;
    body.replaceChildren(...host.gpus.map(function (gpu) {
      const tr = document.createElement("tr");
      const held = gpu.deployments.map((d) => d.name + " " + gib(d.holding_gib)).join(", ");
      tr.append(text("td", gpu.index), text("td", gpu.name), text("td", gib(gpu.total_gib)),
        text("td", gib(gpu.held_gib) + (held ? ": " + held : "")),
        text("td", gpu.used_gib === null ? "—" : gib(gpu.used_gib)),
        text("td", gib(gpu.free_gib)));
      tr.children[1].title = gpu.uuid;
      return tr;
    }));
  }

  function setStatus(el, words, on) {
    if (!el) return;
    el.textContent = words;
    el.classList.toggle("ms-on", on);
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/deployments");
    socket.onopen = function () {
      retry = 500;
      setStatus(liveStatus, "live", true);
    };
    socket.onmessage = function (event) {
      const message = JSON.parse(event.data);
      // The dashboard (dashboard.js) renders from the same messages.
      window.dispatchEvent(new CustomEvent("modelship:live", { detail: message }));
      if (message.type === "snapshot") {
        message.rows.forEach(show);
        showHost(message.host);
      } else if (message.type === "row") {
        show(message.row);
      } else if (message.type === "gone") {
        gone(message.id);
      } else if (message.type === "host") {
        showHost(message.host);
      }
    };
    socket.onclose = function () {
      setStatus(liveStatus, "reconnecting…", false);
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    };
  }

  // The engine log on a deployment's page: the tail the page came with, then new lines as the
  // engine prints them. Paused, new lines wait (the last LOG_LINES of them) until resumed.
  const log = (function () {
    const pre = document.getElementById("live-log");
    const pause = document.getElementById("log-pause");
    const replica = document.getElementById("log-replica");
    const logStatus = document.getElementById("log-status");
    let source = null;
    let paused = false;
    let waiting = [];

    function write(lines) {
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.append(document.createTextNode(lines.map((l) => l + "\n").join("")));
      while (pre.childNodes.length > LOG_LINES) pre.removeChild(pre.firstChild);
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    }

    function line(text) {
      if (!paused) return write([text]);
      waiting.push(text);
      if (waiting.length > LOG_LINES) waiting.shift();
      setStatus(logStatus, "paused, " + waiting.length + " new line(s)", false);
    }

    function follow() {
      if (!pre || source) return;
      const url = pre.dataset.url + "?follow=true&replica=" + (replica ? replica.value : 0);
      source = new EventSource(url);
      source.onopen = () => paused || setStatus(logStatus, "following", true);
      source.onmessage = (event) => line(event.data);
      source.addEventListener("end", function (event) {
        stop();
        setStatus(logStatus, event.data, false);
      });
      source.onerror = function () {
        stop();
        setStatus(logStatus, "not following (retrying)", false);
        setTimeout(follow, 3000);
      };
    }

    function stop() {
      if (source) source.close();
      source = null;
    }

    // The page opens on the log's last lines, and follows from there.
    if (pre) pre.scrollTop = pre.scrollHeight;
    if (pause) {
      pause.onclick = function () {
        paused = !paused;
        pause.textContent = paused ? "Resume" : "Pause";
        if (paused) {
          setStatus(logStatus, "paused", false);
        } else {
          write(waiting);
          waiting = [];
          pre.scrollTop = pre.scrollHeight; // resumed: back to the end, where new lines come
          setStatus(logStatus, source ? "following" : "", !!source);
        }
      };
    }
    if (replica) {
      replica.onchange = function () {
        stop();
        write(["--- replica " + replica.value + " ---"]);
        follow();
      };
    }
    // The engine's state, from the socket: follow it while it runs.
    function engine(running) {
      if (running) follow();
      else if (!source && !paused) setStatus(logStatus, "the engine is not running", false);
    }

    return { engine: engine };
  })();

  // A button that asks first (Stop): pressed only once confirmed.
  document.addEventListener("click", function (event) {
    const button = event.target.closest && event.target.closest("button[data-confirm]");
    if (button && !window.confirm(button.dataset.confirm)) event.preventDefault();
  });

  setInterval(function () {
    for (const el of document.querySelectorAll('[data-live="last_request_at"]')) {
      el.textContent = ago(Number(el.dataset.time));
    }
    for (const el of document.querySelectorAll('[data-live="idle_left"][data-row]')) {
      el.textContent = idleLeft(el.dataset.row);
    }
    for (const el of document.querySelectorAll('[data-live="state_since"][data-time]:not([data-time=""])')) {
      el.textContent = ago(Number(el.dataset.time));
    }
  }, 1000);
  connect();
})();
