// A person's view of a sweep in the MLflow UI: Debian's chromium, headless, driven by playwright-core.
//   node tests/browser/mlflow_ui.mjs check.json
// check.json: {uri, experimentId, parentName, runs: [{id, name, params: {key: value}}], out}
// 0. the experiment's own page, as a first-time user lands on it from a link forge-exp prints: it shows the training
//    runs (not the GenAI traces page), the sweep's parent among them;
// 1. the compare page of the sweep's runs: every param in `params` is a row with each run's value;
// 2. the runs table: the parent run expands to its children, and with the params' columns shown each child's row
//    holds its values.
// Screenshots of both go to `out`. Exits 1 with the reason on the first mismatch.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const check = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const keys = Object.keys(check.runs[0].params);
const fail = (msg) => { throw new Error(msg); };
const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'forge-chromium-'));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1800, height: 1000 },
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
context.setDefaultTimeout(30_000);
const page = context.pages()[0] || await context.newPage();
const closeAssistant = async () => {  // MLflow's assistant side panel takes a third of the width
  const close = page.getByRole('button', { name: 'Close' });
  if (await close.count()) await close.first().click();
};
try {
  page.on('pageerror', (e) => console.error(`page error: ${e.message}`));

  // --- 0. landing: a fresh browser (no stored workflow choice) on the experiment's page ------------------------
  // MLflow 3.17's UI keeps one workflow choice per browser, GenAI for a fresh one, whatever the experiment's kind
  // tag says: the links forge-exp prints name the workflow, as this one does.
  await page.goto(`${check.uri}/#/experiments/${check.experimentId}?workflowType=machine_learning`);
  await page.locator('[col-id="attributes.`Run Name`"]').filter({ has: page.getByText(check.parentName, { exact: true }) })
    .first().waitFor();
  await page.screenshot({ path: path.join(check.out, 'landing.png') });
  console.log(`landing: the experiment page lists the training runs (${check.parentName})`);

  // --- 1. compare page -----------------------------------------------------------------------------------------
  const ids = check.runs.map((r) => r.id);
  await page.goto(`${check.uri}/#/compare-runs?runs=${encodeURIComponent(JSON.stringify(ids))}` +
    `&experiments=${encodeURIComponent(JSON.stringify([check.experimentId]))}`);
  await page.getByText('Show diff only').first().waitFor();
  await page.getByText(`Comparing ${ids.length} Runs`).first().waitFor();
  const lines = (await page.innerText('body')).split('\n');
  const row = (label) => lines.find((l) => l.startsWith(`${label}\t`))?.split('\t').slice(1).map((s) => s.trim());
  const columns = row('Run ID:') || fail('compare page: no "Run ID:" row');
  for (const key of keys) {
    const values = row(key) || fail(`compare page: no row for param ${key}`);
    for (const run of check.runs) {
      const got = values[columns.indexOf(run.id)];
      if (got !== run.params[key]) fail(`compare page: ${key} of ${run.name} is ${got}, expected ${run.params[key]}`);
    }
  }
  await closeAssistant();
  await page.getByText(keys[0], { exact: true }).last().scrollIntoViewIfNeeded();  // the params table in view
  await page.screenshot({ path: path.join(check.out, 'compare-runs.png') });
  console.log(`compare page: ${keys.join(', ')} match for ${ids.length} runs`);

  // --- 2. runs table ---------------------------------------------------------------------------------------------
  await page.goto(`${check.uri}/#/experiments/${check.experimentId}/runs`);
  const nameCell = (name) => page.locator('[col-id="attributes.`Run Name`"]')
    .filter({ has: page.getByText(name, { exact: true }) }).first();
  await nameCell(check.parentName).waitFor();
  await closeAssistant();
  await page.getByRole('button', { name: /Columns/ }).click();
  for (const key of keys) {
    await page.getByPlaceholder('Search columns').fill(key);
    // the column tree's node whose whole title is the key (not sweep.<key> or algorithm.loss.beta)
    await page.locator('[class*="tree-title"]').filter({ hasText: new RegExp(`^${key.replace(/\./g, '\\.')}$`) })
      .first().click();
  }
  await page.keyboard.press('Escape');
  await nameCell(check.parentName).locator('button').first().click();  // expand the sweep: its children show
  for (const run of check.runs) {
    const rowIndex = await nameCell(run.name).locator('xpath=ancestor::*[@row-index][1]').getAttribute('row-index');
    for (const key of keys) {
      const cell = page.locator(`[row-index="${rowIndex}"] [col-id="params.\`${key}\`"]`);
      const got = (await cell.innerText()).trim();
      if (got !== run.params[key]) fail(`runs table: ${key} of ${run.name} is ${got}, expected ${run.params[key]}`);
    }
  }
  await page.screenshot({ path: path.join(check.out, 'runs-table.png') });
  console.log(`runs table: ${check.parentName} expands to ${check.runs.length} runs with ${keys.join(', ')}`);
} catch (e) {
  await page.screenshot({ path: path.join(check.out, 'failure.png') }).catch(() => {});
  console.error(e.message);
  process.exitCode = 1;
} finally {
  await context.close();
  fs.rmSync(userDataDir, { recursive: true, force: true });
}
