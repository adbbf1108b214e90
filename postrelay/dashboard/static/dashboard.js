// postrelay dashboard: live panels on the overview and the DLQ's selection helpers.
// Served as a file (the Content-Security-Policy allows no inline script). The pages work
// without it; it only refreshes the overview and counts checked boxes.
(function () {
  "use strict";

  function refresher(el) {
    var url = el.getAttribute("data-refresh");
    var every = Math.max(parseInt(el.getAttribute("data-every"), 10) || 5, 1) * 1000;
    var live = document.getElementById("live");
    var text = document.getElementById("live-text");
    var toggle = document.getElementById("live-toggle");
    var paused = false;
    var timer = null;
    var failures = 0;

    function show(state, label) {
      if (live) { live.setAttribute("data-state", state); }
      if (text) { text.textContent = label; }
    }

    function schedule(delay) {
      clearTimeout(timer);
      if (!paused) { timer = setTimeout(tick, delay); }
    }

    function tick() {
      if (document.hidden) { schedule(every); return; }
      fetch(url, { credentials: "same-origin", headers: { "X-Dashboard-Fragment": "1" } })
        .then(function (response) {
          if (response.status === 401) {
            window.location.assign(window.location.pathname.replace(/\/$/, "") + "/login");
            return null;
          }
          // 503: the server answered, its database did not (the page says which).
          if (response.status === 503) { throw new Error("database"); }
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.text();
        })
        .then(function (html) {
          if (html === null) { return; }
          // The fragment is rendered by the server with every value escaped.
          el.innerHTML = html;
          failures = 0;
          var panels = el.querySelector("[data-updated]");
          var at = panels ? panels.getAttribute("data-updated").slice(11) : "";
          show("live", "Live · updated " + at + " UTC");
          el.dispatchEvent(new CustomEvent("dashboard:refreshed", { bubbles: true }));
          schedule(every);
        })
        .catch(function (err) {
          failures += 1;
          show("error", err && err.message === "database" ?
            "Database unavailable · retrying" : "Cannot reach the server · retrying");
          schedule(Math.min(every * Math.pow(2, failures), 60000));
        });
    }

    if (toggle) {
      toggle.addEventListener("click", function () {
        paused = !paused;
        toggle.textContent = paused ? "Resume" : "Pause";
        if (paused) { clearTimeout(timer); show("paused", "Paused"); } else { tick(); }
      });
    }
    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && !paused) { tick(); }
    });
    schedule(every);
  }

  function dlqSelection(form) {
    var boxes = form.querySelectorAll("input[name=ids]");
    var page = document.getElementById("select-page");
    var matching = document.getElementById("select-matching");
    var counter = document.getElementById("selected-count");
    var buttons = form.querySelectorAll("[data-needs-selection]");

    function update() {
      var checked = 0;
      boxes.forEach(function (b) { if (b.checked) { checked += 1; } });
      var any = checked > 0 || (matching && matching.checked);
      buttons.forEach(function (b) { b.disabled = !any; });
      if (counter) {
        counter.textContent = matching && matching.checked ? "every matching job" :
          (checked ? checked + " selected" : "");
      }
      if (page) {
        page.checked = checked > 0 && checked === boxes.length;
        page.indeterminate = checked > 0 && checked < boxes.length;
      }
      boxes.forEach(function (b) { b.disabled = !!(matching && matching.checked); });
    }

    if (page) {
      page.addEventListener("change", function () {
        boxes.forEach(function (b) { b.checked = page.checked; });
        update();
      });
    }
    if (matching) { matching.addEventListener("change", update); }
    boxes.forEach(function (b) { b.addEventListener("change", update); });
    update();
  }

  document.querySelectorAll("[data-refresh]").forEach(refresher);
  var dlq = document.getElementById("dlq-form");
  if (dlq) { dlqSelection(dlq); }
})();
