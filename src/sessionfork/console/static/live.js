// The live overview: one EventSource on /events (the page's op and source), each outcome a new
// table row (when the page's code and errors-only filter keep it) and a count in the window's
// per-code table, headline and chart, which roll on as time passes.
// Every value goes in with textContent: ids and messages are never parsed as HTML.
(function () {
  "use strict";
  var table = document.getElementById("live");
  if (!table) { return; }
  var body = table.tBodies[0];
  var state = document.getElementById("live-state");
  var fault = document.getElementById("fault");
  var wantCode = table.getAttribute("data-code") || "";
  var errorsOnly = table.getAttribute("data-errors") === "1";
  var MAX_ROWS = 200;
  var SVG = "http://www.w3.org/2000/svg";

  var overview = document.getElementById("overview");
  var win = null;
  try {
    win = overview ? JSON.parse(overview.getAttribute("data-window")) : null;
  } catch (e) {
    win = null;  // no window to carry on: the live rows still come
  }
  var skew = win ? win.now - Date.now() : 0;  // the server's clock minus this one's
  var BUCKETS = win ? win.buckets : 0;

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
  }
  function link(row, href, text, className) {
    var td = document.createElement("td");
    if (text) {
      var a = document.createElement("a");
      a.href = href;
      a.textContent = text;
      if (className) { a.className = className; }
      td.appendChild(a);
    }
    row.appendChild(td);
  }
  function search(id) { return "/search?q=" + encodeURIComponent(id); }
  function when(ms) {
    return new Date(ms).toISOString().replace("T", " ").replace("Z", "");
  }
  function keeps(r) {
    return (!errorsOnly || r.code !== "OK") && (!wantCode || r.code === wantCode);
  }

  // The window: per code, outcomes per bucket; rolled forward to the server's "now".
  function roll(now) {
    var shift = Math.floor((now - win.start) / win.step) - (BUCKETS - 1);
    if (shift <= 0) { return false; }
    Object.keys(win.series).forEach(function (code) {
      var per = win.series[code];
      for (var i = 0; i < shift; i++) { per.shift(); per.push(0); }
    });
    win.start += shift * win.step;
    return true;
  }
  function count(r) {
    if (!win.series[r.code]) {
      win.series[r.code] = [];
      for (var i = 0; i < BUCKETS; i++) { win.series[r.code].push(0); }
    }
    var bucket = Math.min(Math.max(Math.floor((r.time - win.start) / win.step), 0), BUCKETS - 1);
    win.series[r.code][bucket] += 1;
  }
  function rate(x) { return x.toFixed(x < 1 ? 3 : 1); }
  function sum(list) { return list.reduce(function (a, b) { return a + b; }, 0); }
  function codeRow(code) {
    var found = null;
    Array.prototype.forEach.call(document.querySelectorAll("#stats tbody tr[data-code]"), function (row) {
      if (row.getAttribute("data-code") === code) { found = row; }
    });
    if (found) { return found; }
    var none = document.querySelector("#stats tbody tr.none");
    if (none) { none.parentNode.removeChild(none); }
    var row = document.createElement("tr");
    row.setAttribute("data-code", code);
    link(row, "/?code=" + encodeURIComponent(code) + "&window=" + win.seconds, code, "code code-" + code);
    cell(row, "0").className = "count";
    cell(row, "0.000").className = "rate";
    cell(row, "0.0 %").className = "share";
    cell(row, "-"); cell(row, "-"); cell(row, "-");
    document.querySelector("#stats tbody").appendChild(row);
    return row;
  }
  function draw() {
    var codes = Object.keys(win.series);
    var total = 0, errors = 0, perBucket = [], errBucket = [];
    for (var i = 0; i < BUCKETS; i++) { perBucket.push(0); errBucket.push(0); }
    codes.forEach(function (code) {
      var per = win.series[code];
      var n = sum(per);
      total += n;
      if (code !== "OK") { errors += n; }
      per.forEach(function (v, i) { perBucket[i] += v; if (code !== "OK") { errBucket[i] += v; } });
    });
    codes.forEach(function (code) {
      var n = sum(win.series[code]);
      var row = codeRow(code);
      row.querySelector(".count").textContent = String(n);
      row.querySelector(".rate").textContent = rate(n / win.seconds);
      row.querySelector(".share").textContent = (total ? 100 * n / total : 0).toFixed(1) + " %";
    });
    document.getElementById("total").textContent = String(total);
    document.getElementById("rate").textContent = rate(total / win.seconds);
    document.getElementById("errors").textContent = String(errors);
    document.getElementById("error-share").textContent = (total ? 100 * errors / total : 0).toFixed(1);
    document.getElementById("error-share-box").className = errors ? "bad" : "";

    var svg = document.getElementById("chart");
    while (svg.lastChild && svg.lastChild.nodeName !== "title") { svg.removeChild(svg.lastChild); }
    var top = Math.max.apply(null, perBucket.concat([1]));
    var width = 600 / BUCKETS, height = 120, points = [];
    perBucket.forEach(function (n, i) {
      var bar = document.createElementNS(SVG, "rect");
      var h = height * n / top;
      bar.setAttribute("x", String(i * width + 0.5));
      bar.setAttribute("y", String(height - h));
      bar.setAttribute("width", String(Math.max(width - 1, 0.5)));
      bar.setAttribute("height", String(h));
      bar.setAttribute("class", "bar");
      bar.setAttribute("data-count", String(n));
      svg.appendChild(bar);
      if (errBucket[i]) {
        var err = document.createElementNS(SVG, "rect");
        var e = height * errBucket[i] / top;
        err.setAttribute("x", String(i * width + 0.5));
        err.setAttribute("y", String(height - e));
        err.setAttribute("width", String(Math.max(width - 1, 0.5)));
        err.setAttribute("height", String(e));
        err.setAttribute("class", "bar err");
        svg.appendChild(err);
      }
      var pct = n ? errBucket[i] / n : 0;
      points.push((i * width + width / 2).toFixed(1) + "," + (height - pct * (height - 2) - 1).toFixed(1));
    });
    var line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("class", "pct");
    svg.appendChild(line);
    document.getElementById("chart-max").textContent = rate(top / (win.step / 1000));
    svg.setAttribute("data-total", String(total));
  }
  if (win) {
    roll(Date.now() + skew);
    draw();
    window.setInterval(function () { if (roll(Date.now() + skew)) { draw(); } }, 1000);
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
    fault.hidden = true;
    if (win) {
      roll(Math.max(Date.now() + skew, r.time));
      count(r);
      draw();
    }
    if (!keeps(r)) { return; }
    var row = document.createElement("tr");
    row.setAttribute("data-request", r.requestId);
    row.className = "fresh";
    cell(row, when(r.time));
    cell(row, String(r.shard));
    link(row, search(r.requestId), r.requestId);
    cell(row, r.op);
    link(row, "/?code=" + encodeURIComponent(r.code), r.code, "code code-" + r.code);
    link(row, search(r.source), r.source);
    cell(row, r.detail).className = "detail";
    cell(row, r.latencyMs.toFixed(2));
    body.insertBefore(row, body.firstChild);
    while (body.rows.length > MAX_ROWS) { body.deleteRow(body.rows.length - 1); }
  });
  source.onerror = function () {
    state.textContent = "reconnecting…";
    document.body.setAttribute("data-live", "off");
  };
})();
