// The course's text search (docs/search_text.md): every word of the query must appear in a
// section (case-insensitive; a word matches the start of a word in the text, so "except"
// finds "exception"). Sections are ranked by where the words appear (heading, then page
// title, then text) and how often. The index, FLASHSTEP_TEXT_INDEX, is written by
// scripts/docs_search.py after Doxygen (search_text_index.js, loaded here by a <script>
// element: a fetch() of a file would not work from file://).
(function () {
  "use strict";
  var MAX_RESULTS = 40;

  function escapeHtml(s) {
    return s.replace(/[&<>"]/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c];
    });
  }

  function escapeRegex(s) {
    return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  }

  function wordsOf(query) {
    return query.toLowerCase().split(/\s+/).filter(function (w) { return w.length > 0; });
  }

  function startsOf(word) {
    return new RegExp("(^|[^a-z0-9_])" + escapeRegex(word), "gi");
  }

  function count(text, re) {
    var m = text.match(re);
    return m ? m.length : 0;
  }

  function snippet(text, words) {
    var lower = text.toLowerCase(), at = -1;
    words.forEach(function (w) {
      var i = lower.indexOf(w);
      if (i >= 0 && (at < 0 || i < at)) at = i;
    });
    var start = Math.max(0, at - 80), end = Math.min(text.length, start + 260);
    var piece = (start > 0 ? "… " : "") + text.slice(start, end) + (end < text.length ? " …" : "");
    var out = escapeHtml(piece);
    words.forEach(function (w) {
      out = out.replace(new RegExp("(" + escapeRegex(escapeHtml(w)) + ")", "gi"), "<mark>$1</mark>");
    });
    return out;
  }

  function search(query) {
    var words = wordsOf(query), hits = [];
    if (!words.length || typeof FLASHSTEP_TEXT_INDEX === "undefined") return hits;
    var res = words.map(startsOf);
    FLASHSTEP_TEXT_INDEX.forEach(function (page) {
      page.s.forEach(function (section) {
        var score = 0, all = true;
        for (var i = 0; i < words.length; i++) {
          var inHeading = count(section.h, res[i]), inTitle = count(page.t, res[i]), inText = count(section.x, res[i]);
          if (!inHeading && !inTitle && !inText) { all = false; break; }
          score += 20 * inHeading + 8 * inTitle + Math.min(inText, 10);
        }
        if (all) hits.push({page: page, section: section, score: score});
      });
    });
    hits.sort(function (a, b) { return b.score - a.score; });
    return hits;
  }

  function show(query, list, summary) {
    var hits = search(query);
    list.innerHTML = "";
    if (!wordsOf(query).length) { summary.textContent = ""; return; }
    summary.textContent = hits.length
      ? hits.length + " section" + (hits.length === 1 ? "" : "s") + " of the course mention " +
        (wordsOf(query).length > 1 ? "all of these words" : "this word") +
        (hits.length > MAX_RESULTS ? "; the first " + MAX_RESULTS + " are shown" : "") + "."
      : "No section of the course mentions " + (wordsOf(query).length > 1 ? "all of these words." : "this word.");
    hits.slice(0, MAX_RESULTS).forEach(function (hit) {
      var li = document.createElement("li");
      var href = hit.page.p + (hit.section.a ? "#" + hit.section.a : "");
      var where = hit.section.h ? hit.page.t + " › " + hit.section.h : hit.page.t;
      li.innerHTML = '<a class="el" href="' + escapeHtml(href) + '">' + escapeHtml(where) + "</a><br>" +
                     '<span class="fs-where">' + snippet(hit.section.x || hit.section.h, wordsOf(query)) + "</span>";
      list.appendChild(li);
    });
  }

  function start() {
    var box = document.getElementById("fs-search-box");
    var list = document.getElementById("fs-search-results");
    var summary = document.getElementById("fs-search-summary");
    if (!box || !list || !summary) return;
    var given = new URLSearchParams(window.location.search).get("q");
    if (given) box.value = given;
    var timer = null;
    box.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { show(box.value, list, summary); }, 120);
    });
    show(box.value, list, summary);
    box.focus();
  }

  function load() {
    var index = document.createElement("script");
    index.src = "search_text_index.js";
    index.onload = start;
    index.onerror = function () {
      var summary = document.getElementById("fs-search-summary");
      if (summary) summary.textContent = "The search index (search_text_index.js) is missing: rebuild the docs.";
    };
    document.body.appendChild(index);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", load);
  else load();
})();
