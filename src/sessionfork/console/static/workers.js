// The Workers page, refreshed in place: every few seconds the page is read again and each part
// marked data-part (a shard's state, workers and queue; the audit trail) is replaced by the new
// one; the forms (a token being typed) are left alone. A failed read shows the error banner.
(function () {
  "use strict";
  var note = document.getElementById("refresh");
  if (!note || !window.fetch || !window.DOMParser) { return; }
  var every = 1000 * Number(note.getAttribute("data-every") || "5");
  var fault = document.getElementById("fault");
  var url = window.location.pathname;  // without ?done=: the message is not repeated

  function refresh() {
    window.fetch(url, { headers: { Accept: "text/html" }, cache: "no-store" }).then(function (answer) {
      return answer.text().then(function (text) { return { ok: answer.ok, text: text }; });
    }).then(function (got) {
      var fresh = new DOMParser().parseFromString(got.text, "text/html");
      if (!got.ok) {
        var banner = fresh.getElementById("fault");
        fault.textContent = banner ? banner.textContent : "the console could not read the workers";
        fault.hidden = false;
        return;
      }
      Array.prototype.forEach.call(document.querySelectorAll("[data-part]"), function (part) {
        var name = part.getAttribute("data-part");
        var found = null;
        Array.prototype.forEach.call(fresh.querySelectorAll("[data-part]"), function (candidate) {
          if (candidate.getAttribute("data-part") === name) { found = candidate; }
        });
        if (found) { part.replaceWith(document.importNode(found, true)); }
      });
      var stamp = fresh.getElementById("refreshed");
      if (stamp) { document.getElementById("refreshed").textContent = stamp.textContent; }
      fault.hidden = true;
      document.body.setAttribute("data-refreshes", String(Number(document.body.getAttribute("data-refreshes") || "0") + 1));
    }).catch(function () {
      fault.textContent = "the console did not answer";
      fault.hidden = false;
    });
  }
  window.setInterval(refresh, every);
})();
