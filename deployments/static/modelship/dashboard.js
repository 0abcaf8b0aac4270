// The admin's landing page: what runs on which GPU, what is starting (and at which step),
// what waits, the traffic of the last 15 minutes and the last failures, drawn from the
// data the page came with and kept current from the live socket's messages (live.js hands
// each one over as a "modelship:live" event). Nothing but this file and the site's data.
(function () {
  "use strict";
  const root = document.getElementById("ms-dashboard");
  if (!root) return;
  const data = JSON.parse(document.getElementById("dashboard-data").textContent);
  const rows = new Map(data.rows.map((row) => [row.id, row]));
  let host = data.host;
  const listUrl = root.dataset.changeUrl;
  const RESERVED = "#adb5bd";

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === "style") Object.assign(node.style, value);
      else if (name === "className") node.className = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function gib(value) {
    return (Math.round(value * 100) / 100).toFixed(value >= 100 ? 0 : 1);
  }

  function duration(seconds) {
    seconds = Math.max(0, Math.floor(seconds));
    if (seconds < 60) return seconds + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min " + (seconds % 60) + " s";
    return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
  }

  function link(row) {
    return el("a", { href: listUrl + row.id + "/change/", className: "ms-name", title: row.name }, row.name);
  }

  function badge(row) {
    return el("span", { className: "ms-badge", style: { background: row.colour }, title: row.reason }, row.label);
  }

  function byName() {
    return [...rows.values()].sort((a, b) => a.name.localeCompare(b.name));
  }

  // One bar: a segment per holder (name and GiB, in its state's colour), what make-room
  // freed for the queue's head, and a mark where on-demand deployments' share begins.
  function bar(title, total, holders, extra) {
    const track = el("div", { className: "ms-bar", role: "img" });
    let used = 0;
    for (const holder of holders) {
      if (!(holder.gib > 0)) continue;
      used += holder.gib;
      const width = Math.min(100, (holder.gib / total) * 100);
      track.append(el("div", {
        className: "ms-seg" + (holder.reserved ? " ms-reserved" : ""),
        style: { width: width + "%", background: holder.colour },
        title: holder.name + ": " + gib(holder.gib) + " GiB" + (holder.state ? " (" + holder.state + ")" : ""),
        "data-name": holder.name,
      }, el("span", {}, holder.name + " " + gib(holder.gib))));
    }
    if (extra && extra.mark !== undefined && extra.mark > 0 && extra.mark < total) {
      track.append(el("div", { className: "ms-mark", style: { left: (extra.mark / total) * 100 + "%" },
        title: "on-demand deployments use what is right of this line" }));
    }
    track.setAttribute("aria-label", title + ": " + gib(used) + " of " + gib(total) + " GiB");
    return el("div", { className: "ms-bar-row" },
      el("div", { className: "ms-bar-title" }, title,
        el("span", { className: "ms-sub" }, " " + gib(used) + " of " + gib(total) + " GiB" + (extra && extra.note ? " · " + extra.note : ""))),
      track);
  }

  function colourOf(name) {
    for (const row of rows.values()) if (row.name === name) return [row.colour, row.label];
    return ["#333", ""];
  }

  function holder(name, value) {
    const [colour, state] = colourOf(name);
    return { name: name, gib: value, colour: colour, state: state };
  }

  function reserved() {
    return (host.reserved || []).map((r) => ({
      name: "reserved for " + r.name, gib: r.gib, colour: RESERVED, reserved: true,
    }));
  }

  function drawMemory() {
    const bars = document.getElementById("dash-bars");
    const drawn = [];
    const pinned = host.capacity_gib - host.on_demand_capacity_gib;
    const capacity = "on-demand capacity " + gib(host.on_demand_capacity_gib) + " GiB";
    if (host.gpus.length) {
      for (const gpu of host.gpus) {
        const driver = gpu.used_gib === null ? "" : "driver reports " + gib(gpu.used_gib) + " GiB used";
        drawn.push(bar("GPU " + gpu.index + " · " + gpu.name, gpu.total_gib,
          gpu.deployments.map((d) => holder(d.name, d.holding_gib)), { note: driver }));
      }
      const queued = reserved();
      drawn.push(el("p", { className: "ms-sub" }, capacity +
        (queued.length ? " · " + queued.map((r) => r.name + " " + gib(r.gib) + " GiB").join(", ") : "")));
    } else {
      // No GPU: the memory budget Modelship places engines in (MSHIP_MEMORY_CAPACITY_GIB).
      const holders = byName().filter((row) => row.holding_gib > 0)
        .sort((a, b) => (b.on_demand ? 0 : 1) - (a.on_demand ? 0 : 1))
        .map((row) => holder(row.name, row.holding_gib));
      drawn.push(bar("Memory budget (no GPU)", host.capacity_gib, holders.concat(reserved()),
        { mark: pinned, note: capacity }));
    }
    if (host.ram) {
      drawn.push(bar("Host memory (CPU engines and everything else)", host.ram.total_gib,
        [{ name: "in use", gib: host.ram.used_gib, colour: "#6c757d" }], {}));
    }
    bars.replaceChildren(...drawn);
  }

  function starting(row) {
    return row.label.startsWith("starting") || row.label.startsWith("queued");
  }

  function drawStarting() {
    const now = Date.now() / 1000;
    const list = byName().filter(starting);
    const body = document.querySelector("#dash-starting .ms-body");
    if (!list.length) return body.replaceChildren(el("p", { className: "ms-none" }, "Nothing is starting."));
    body.replaceChildren(el("ul", {}, ...list.map((row) => {
      // How long: since the state changed to starting, or since the oldest request queued
      // (a start still preparing or asked for by a request keeps its old state's time).
      const from = row.state === "starting" ? row.state_changed_ts : row.queued_since;
      const since = from ? " · " + duration(now - from) : "";
      const step = row.label.split(" · ").slice(1).join(" · ");
      const progress = row.start_phase && row.reason ? el("div", { className: "ms-sub ms-progress" }, row.reason) : null;
      return el("li", { "data-name": row.name }, link(row), " ", el("strong", {}, step || row.label), since, progress);
    })));
  }

  function drawQueue() {
    const now = Date.now() / 1000;
    const list = byName().filter((row) => row.queued > 0 || row.inflight > 0);
    const body = document.querySelector("#dash-queue .ms-body");
    const waiting = list.reduce((sum, row) => sum + row.queued, 0);
    if (!list.length) return body.replaceChildren(el("p", { className: "ms-none" }, "No request in flight or waiting."));
    body.replaceChildren(
      el("p", {}, waiting + " request" + (waiting === 1 ? "" : "s") + " waiting for a start or for memory"),
      el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "deployment"), el("th", {}, "in flight"),
        el("th", {}, "waiting"), el("th", {}, "oldest wait"), el("th", {}, "queue place"),
        el("th", {}, "ready in"))),
      el("tbody", {}, ...list.map((row) => el("tr", { "data-name": row.name }, el("td", {}, link(row)),
        el("td", {}, String(row.inflight)), el("td", {}, String(row.queued)),
        el("td", {}, row.queued_since ? duration(now - row.queued_since) : "—"),
        el("td", {}, row.position ? String(row.position) : "—"),
        el("td", {}, row.eta_s != null ? "about " + duration(row.eta_s) : "—"))))));
  }

  // A line chart of one rate: SVG, scaled to its own maximum.
  function chart(points, key, label) {
    const width = 300, height = 60;
    const now = Date.now() / 1000;
    const top = Math.max(1e-9, ...points.map((p) => p[key]));
    const x = (at) => width - ((now - at) / 900) * width;
    const y = (value) => height - (value / top) * (height - 4);
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("class", "ms-chart");
    svg.setAttribute("preserveAspectRatio", "none");
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", points.map((p) => Math.max(0, x(p.at)).toFixed(1) + "," + y(p[key]).toFixed(1)).join(" "));
    svg.append(line);
    const last = points.length ? points[points.length - 1][key] : 0;
    const peak = points.length ? Math.max(...points.map((p) => p[key])) : 0;
    return el("div", { className: "ms-chart-box", "data-series": key },
      el("div", {}, el("strong", {}, label + ": " + last.toFixed(key === "rps" ? 2 : 1)),
        el("span", { className: "ms-sub" }, " · peak " + peak.toFixed(key === "rps" ? 2 : 1))),
      svg, el("div", { className: "ms-axis" }, el("span", {}, "15 min ago"), el("span", {}, "now")));
  }

  function drawTraffic() {
    const points = host.traffic || [];
    const body = document.querySelector("#dash-traffic .ms-body");
    if (points.length < 1) {
      body.replaceChildren(el("p", { className: "ms-none" }, "Counting: the first figures come within 20 seconds of the server's start."));
      return;
    }
    body.replaceChildren(chart(points, "rps", "requests/s"), chart(points, "tps", "tokens/s"));
  }

  let failuresShown = null;

  function drawFailures() {
    const body = document.querySelector("#dash-failures .ms-body");
    // Drawn again only when they change: a reader's open reason stays open.
    const key = JSON.stringify(host.failures);
    if (key === failuresShown) return;
    failuresShown = key;
    if (host.failures === null) {
      return body.replaceChildren(el("p", { className: "ms-none" }, "Not shown: it needs the permission to view deployment events."));
    }
    const failures = host.failures || [];
    if (!failures.length) return body.replaceChildren(el("p", { className: "ms-none" }, "No failure recorded."));
    body.replaceChildren(el("ul", {}, ...failures.map((f) => {
      const name = f.id ? el("a", { href: listUrl + f.id + "/change/" }, f.name) : el("span", {}, f.name);
      const first = (f.reason.split("\n")[0] || "no reason recorded");
      return el("li", { className: "ms-failure" }, el("span", { className: "ms-sub" }, f.when + " "), name,
        " " + f.kind + ": ",
        el("details", {}, el("summary", {}, first.length > 160 ? first.slice(0, 160) + "…" : first),
          el("pre", { className: "ms-reason" }, f.reason)));
    })));
  }

  function drawDeployments() {
    const body = document.querySelector("#dash-deployments tbody");
    body.replaceChildren(...byName().map((row) => el("tr", { "data-name": row.name },
      el("td", {}, link(row)), el("td", {}, badge(row)), el("td", {}, row.mode),
      el("td", {}, row.activity), el("td", {}, gib(row.holding_gib) + " / " + gib(row.need_gib)),
      el("td", {}, row.gpus))));
  }

  function drawSummary() {
    const counts = {};
    for (const row of rows.values()) {
      const word = row.label.split(" · ")[0];
      counts[word] = (counts[word] || 0) + 1;
    }
    const order = ["ready", "starting", "queued", "asleep", "stopping", "failed", "stopped", "planned"];
    const parts = order.filter((w) => counts[w]).map((w) => counts[w] + " " + w);
    const memory = gib(host.held_gib) + " of " + gib(host.capacity_gib) + " GiB held" +
      (host.gpus.length ? " on " + host.gpus.length + " GPU" + (host.gpus.length > 1 ? "s" : "") : "");
    document.getElementById("dash-summary").textContent =
      (parts.join(" · ") || "No deployment yet") + " — " + memory;
  }

  function draw() {
    drawSummary();
    drawMemory();
    drawStarting();
    drawQueue();
    drawTraffic();
    drawFailures();
    drawDeployments();
  }

  window.addEventListener("modelship:live", function (event) {
    const message = event.detail;
    if (message.type === "snapshot") {
      rows.clear();
      for (const row of message.rows) rows.set(row.id, row);
      host = message.host;
    } else if (message.type === "row") {
      rows.set(message.row.id, message.row);
    } else if (message.type === "gone") {
      rows.delete(message.id);
    } else if (message.type === "host") {
      host = message.host;
    }
    draw();
  });
  draw();
  setInterval(function () { drawStarting(); drawQueue(); }, 1000); // the waits' clocks
})();
