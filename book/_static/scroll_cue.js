/* A wide table or chart scrolls sideways inside its own box (custom.css), and on a phone its first screen shows only
   its first columns: nothing but this cue tells the reader that more lies to the right. Above every such box that is
   wider than it can show, a line says which way it scrolls; it changes as the reader scrolls, and goes when the box
   fits (a wider window). Code and equations, which scroll too, get no cue: a cut line of code is a familiar sight. */
(() => {
  const BOXES = ".bd-article table.table, .bd-article .table-wrapper, .bd-article div.cell_output .output.text_html";

  function update(box) {
    let cue = box.previousElementSibling;
    if (!(cue && cue.classList.contains("scroll-cue"))) {
      cue = null;
    }
    const hiddenRight = box.scrollWidth - box.clientWidth - box.scrollLeft > 1;
    const hiddenLeft = box.scrollLeft > 1;
    if (!hiddenRight && !hiddenLeft) {
      if (cue) cue.remove();
      return;
    }
    if (!cue) {
      cue = document.createElement("div");
      cue.className = "scroll-cue";
      cue.setAttribute("aria-hidden", "true"); // a screen reader reads the whole box anyway
      box.before(cue);
    }
    cue.textContent = hiddenRight ? (hiddenLeft ? "← scrolls both ways →" : "scroll sideways for more →")
      : "← scrolled to the end";
  }

  function updateAll() {
    for (const box of document.querySelectorAll(BOXES)) {
      if (box.querySelector(BOXES)) continue; // the innermost box is the one that scrolls
      update(box);
    }
  }

  function start() {
    updateAll();
    for (const box of document.querySelectorAll(BOXES)) {
      box.addEventListener("scroll", () => update(box), { passive: true });
    }
    window.addEventListener("resize", updateAll);
    // Charts are drawn after the page loads (Vega), and fonts and MathJax change widths: look again as they come.
    let queued = false;
    const observer = new ResizeObserver(() => {
      if (queued) return;
      queued = true;
      requestAnimationFrame(() => { queued = false; updateAll(); }); // after layout: no resize loop
    });
    for (const box of document.querySelectorAll(BOXES)) {
      observer.observe(box);
      for (const child of box.children) observer.observe(child);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
