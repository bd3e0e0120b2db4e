// The live view: one EventSource on /events (the page's filter), each outcome a new table row.
// Every value goes in with textContent: ids and messages are never parsed as HTML.
(function () {
  "use strict";
  var table = document.getElementById("live");
  if (!table) { return; }
  var body = table.tBodies[0];
  var state = document.getElementById("live-state");
  var fault = document.getElementById("fault");
  var MAX_ROWS = 200;

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
  }
  function link(row, id) {
    var td = document.createElement("td");
    if (id) {
      var a = document.createElement("a");
      a.href = "/search?q=" + encodeURIComponent(id);
      a.textContent = id;
      td.appendChild(a);
    }
    row.appendChild(td);
  }
  function when(ms) {
    return new Date(ms).toISOString().replace("T", " ").replace("Z", "");
  }

  var source = new EventSource(table.getAttribute("data-events"));
  source.addEventListener("ready", function () {
    state.textContent = "live";
    document.body.setAttribute("data-live", "on");
    fault.hidden = true;
  });
  source.addEventListener("fault", function (event) {
    fault.textContent = JSON.parse(event.data);
    fault.hidden = false;
  });
  source.addEventListener("restored", function () {
    fault.hidden = true;
  });
  source.addEventListener("outcome", function (event) {
    var r = JSON.parse(event.data);
    var row = document.createElement("tr");
    row.setAttribute("data-request", r.requestId);
    row.className = "fresh";
    cell(row, when(r.time));
    cell(row, String(r.shard));
    link(row, r.requestId);
    cell(row, r.op);
    cell(row, r.code).className = "code code-" + r.code;
    link(row, r.source);
    cell(row, r.detail).className = "detail";
    cell(row, r.latencyMs.toFixed(2));
    body.insertBefore(row, body.firstChild);
    while (body.rows.length > MAX_ROWS) { body.deleteRow(body.rows.length - 1); }
    fault.hidden = true;
  });
  source.onerror = function () {
    state.textContent = "reconnecting…";
    document.body.setAttribute("data-live", "off");
  };
})();
