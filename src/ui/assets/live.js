// Setpoint dashboard: live updates. The pages work without this script;
// with it, each page opens one Server-Sent Events stream (its <main>'s
// data-live) and, when it says something changed, fetches the same page
// again and swaps in its <main>. No framework, no build step.
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main || !main.dataset.live || !window.EventSource) return;
  var pending = null;
  var busy = false;

  function refresh() {
    pending = null;
    if (busy) { pending = setTimeout(refresh, 100); return; }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("main");
        if (!fresh) return;
        // Keep the user's unsent filter choices.
        var focused = document.activeElement && document.activeElement.closest("form");
        if (focused) return;
        main.innerHTML = fresh.innerHTML;
        main.dataset.updated = String(Date.now());
      })
      .catch(function () {})
      .then(function () { busy = false; });
  }

  function schedule() {
    if (!pending) pending = setTimeout(refresh, 150);
  }

  var source = new EventSource(main.dataset.live, { withCredentials: true });
  source.addEventListener("change", schedule);
  source.addEventListener("lagged", schedule);
  source.addEventListener("open", function () { main.dataset.connected = "true"; });
})();
