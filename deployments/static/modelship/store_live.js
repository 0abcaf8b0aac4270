// The Models page: while a pull is queued or running, its state cell shows its progress
// (bytes, rate, time left), read from /api/stored-models/ every second; a pull that ends
// reloads the page (its size, format and metadata are read once it lands).
(function () {
  "use strict";
  const RUNNING = ["queued", "pulling"];

  function size(bytes) {
    let value = bytes;
    for (const unit of ["B", "KiB", "MiB", "GiB"]) {
      if (value < 1024) return unit === "B" ? value + " B" : value.toFixed(1) + " " + unit;
      value /= 1024;
    }
    return value.toFixed(1) + " TiB";
  }

  function describe(row) {
    if (row.state !== "pulling") return row.state;
    let text = "pulling " + size(row.bytes_done);
    if (row.bytes_total) {
      text += " of " + size(row.bytes_total) + " (" + Math.floor((100 * row.bytes_done) / row.bytes_total) + "%)";
    }
    if (row.rate_bps) text += ", " + size(Math.round(row.rate_bps)) + "/s";
    if (row.eta_s !== null && row.eta_s !== undefined) text += ", " + Math.ceil(row.eta_s) + " s left";
    return text;
  }

  async function poll() {
    const cells = Array.from(document.querySelectorAll("[data-store-id]"));
    const running = cells.filter((c) => RUNNING.includes(c.dataset.state));
    if (!running.length) return;
    try {
      for (const cell of running) {
        const answer = await fetch("/api/stored-models/" + cell.dataset.storeId + "/", {
          credentials: "same-origin",
          headers: { Accept: "application/json" },
        });
        if (!answer.ok) continue;
        const row = await answer.json();
        if (!RUNNING.includes(row.state)) {
          window.location.reload();
          return;
        }
        cell.textContent = describe(row);
        cell.dataset.state = row.state;
      }
    } catch (error) {
      // The site is away for a moment: the next poll tries again.
    }
    window.setTimeout(poll, 1000);
  }

  document.addEventListener("DOMContentLoaded", poll);
})();
