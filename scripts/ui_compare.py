"""The MLflow compare page of the two parent runs (scripts/ui_check.py's first page): its
metrics grid read row by row, its tags table, "show diff only"."""

from __future__ import annotations

# What the compare page must show side by side for the two parents (plus the weights hash).
SIDE_BY_SIDE_METRICS = ("success_rate", "success_rate_lo", "success_rate_hi")

# The compare page's metrics table is two react-virtualized grids side by side (names, then
# one column per run), 300 px tall: only the rows in view are in the DOM. This scrolls the
# values grid to `to` px and reads the rows in view: {rows: {name: [values]}, at: {name:
# its offset}, top, max}.
# The page moves the names grid to where the values grid was one scroll event earlier,
# so it scrolls twice, one pixel apart, to leave both grids (and the screenshot) aligned.
METRIC_GRID = """async (to) => {
  const link = document.querySelector('a[title="Plot chart"]');
  if (!link) return null;
  const names = link.closest('.ReactVirtualized__Grid');
  const grids = names.parentElement.parentElement.querySelectorAll('.ReactVirtualized__Grid');
  const values = grids[grids.length - 1];
  const max = values.scrollHeight - values.clientHeight;
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  to = Math.min(to, max);
  values.scrollTop = to > 0 ? to - 1 : 1;
  await sleep(250);
  values.scrollTop = to;
  await sleep(500);
  const rows = {}, byTop = {}, at = {};
  for (const cell of names.querySelectorAll('a[title="Plot chart"]')) {
    const top = cell.parentElement.style.top, name = cell.textContent.trim();
    byTop[top] = name; rows[name] = []; at[name] = parseFloat(top);
  }
  const cells = [...values.querySelectorAll('.ReactVirtualized__Grid__innerScrollContainer > div')]
    .sort((a, b) => parseFloat(a.style.left) - parseFloat(b.style.left));
  for (const cell of cells) if (byTop[cell.style.top] !== undefined)
    rows[byTop[cell.style.top]].push(cell.textContent.trim());
  return {rows, at, top: values.scrollTop, max};
}"""

# One row of a plain compare table (parameters, tags): its cells' text, or null.
TABLE_ROW = """(name) => {
  const th = [...document.querySelectorAll('table.mlflow-compare-table th')]
    .find(h => h.textContent.trim() === name);
  return th ? [...th.parentElement.querySelectorAll('td')].map(td => td.textContent.trim()) : null;
}"""


# Scrolls a plain compare table's row into view, at the bottom of the screen.
SHOW_ROW = """(name) => [...document.querySelectorAll('table.mlflow-compare-table th')]
  .find(h => h.textContent.trim() === name)?.scrollIntoView({block: 'end'})"""


def metric_rows(page) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Every row of the compare page's metrics table (its cells, its offset), scrolled
    through from the top, three rows (135 px) at a time."""
    rows: dict[str, list[str]] = {}
    at: dict[str, float] = {}
    top = 0
    while (seen := page.evaluate(METRIC_GRID, top)) is not None:
        rows.update(seen["rows"])
        at.update(seen["at"])
        if seen["top"] >= seen["max"]:
            break
        top = seen["top"] + 135
    return rows, at


def shown(value: float, text: str) -> bool:
    """Does `text` show `value` as MLflow's formatMetric rounds it (3 decimals below 10)?"""
    try:
        return abs(float(text) - value) <= 0.0005 + 0.005 * abs(value)
    except ValueError:
        return False


def compare_page(page, shot, base: str, runs: dict, known: dict) -> list[str]:
    """The two parents compared side by side, at the URL `agentrl reproduce` prints."""
    from components import tracking

    failures: list[str] = []
    exp = known["experiment"]
    pair = [runs["original"], runs["reproduction"]]
    page.goto(tracking.compare_url(pair, exp, base))
    page.get_by_text("Run details").first.wait_for(timeout=120_000)
    page.locator('a[title="Plot chart"]').first.wait_for(timeout=120_000)
    page.wait_for_timeout(3000)
    if "Nothing to compare" in page.inner_text("body"):
        failures.append("compare page: 'Nothing to compare!'")
    # Fold what is not compared here, so the metrics and tags share the screen.
    for section in ("Visualizations", "Parameters", "Artifacts"):
        page.get_by_text(section, exact=True).first.click()
    assistant = page.get_by_label("Close")  # MLflow's assistant panel, when it opens
    if assistant.count():
        assistant.first.click()
    page.wait_for_timeout(1000)
    rows, at = metric_rows(page)
    for key in SIDE_BY_SIDE_METRICS:
        cells = rows.get(key)
        want = [known["values"][r][key] for r in pair]
        if cells is None:
            failures.append(f"compare page: no {key} row (rows: {sorted(rows)})")
        elif len(cells) != 2 or not all(map(shown, want, cells)):
            failures.append(f"compare page: {key} shows {cells}, logged {want}")
    tags = page.evaluate(TABLE_ROW, "weights_sha256")
    want = [known["values"][r]["weights_sha256"] for r in pair]
    if tags != want:
        failures.append(f"compare page: weights_sha256 shows {tags}, logged {want}")
    # In one screenshot: the success rows (two above them) and the weights hash row.
    page.evaluate(METRIC_GRID, max(0, at.get("success_rate", 0) - 90))
    page.evaluate(SHOW_ROW, "weights_sha256")
    shot("compare-parents", 2000)
    # "Show diff only" on the metrics: what differs between the two, and nothing else.
    page.get_by_label("Metrics - Show diff only").click()
    page.wait_for_timeout(2000)
    diff, _ = metric_rows(page)
    if sorted(diff) != known["differing"]:
        failures.append(f"compare page, diff only: {sorted(diff)}, differing {known['differing']}")
    page.evaluate(METRIC_GRID, 0)
    shot("compare-parents-diff", 2000)
    return failures
