// Runs pallasgen's build path in Pyodide, off the page's thread. Everything it loads
// comes from this site: the Pyodide runtime under pyodide/, the wheels under wheels/.
importScripts("pyodide/pyodide.js");

const here = (path) => new URL(path, self.location).href;
let ready = null;
let pending = null; // the newest request not yet built: it supersedes any before it
let running = false;
let builds = 0; // requests built, for the page (superseded ones are dropped unbuilt)

async function start() {
  const site = await (await fetch(here("site.json"))).json();
  self.postMessage({ type: "status", text: "Loading Pyodide…" });
  const pyodide = await loadPyodide({ indexURL: here("pyodide/") });
  self.postMessage({ type: "status", text: `Installing ${site.wheels.length} wheels…` });
  // micropip is not in the pyodide npm package (Pyodide would fetch it from its CDN):
  // the wheels are unpacked into site-packages directly, which is all installing a pure wheel does.
  for (const wheel of site.wheels) {
    const data = new Uint8Array(await (await fetch(here(wheel))).arrayBuffer());
    pyodide.FS.writeFile("/tmp/wheel.whl", data);
    pyodide.runPython("import site, zipfile; zipfile.ZipFile('/tmp/wheel.whl').extractall(site.getsitepackages()[0])");
  }
  self.postMessage({ type: "status", text: "Importing pallasgen…" });
  pyodide.runPython("import importlib; importlib.invalidate_caches()");
  return pyodide.pyimport("pallasgen.playground.session");
}

async function build({ id, name, source, tuning, kernel }) {
  try {
    ready = ready || start();
    const session = await ready;
    if (pending !== null) return; // superseded while Pyodide loaded
    const started = performance.now();
    builds += 1;
    const built = session.build(name, source, tuning).toJs({ dict_converter: Object.fromEntries });
    const shown = session.tiling(name, source, kernel).toJs({ dict_converter: Object.fromEntries });
    self.postMessage({ type: "result", id, builds, ...built, ...shown, ms: performance.now() - started });
  } catch (error) {
    self.postMessage({ type: "failure", id, builds, text: String(error) });
  }
}

// A build blocks this thread, so requests sent meanwhile wait in its queue: after each
// build, yield to let them all arrive, then build only the newest (latest wins).
self.onmessage = async (event) => {
  pending = event.data;
  if (running) return;
  running = true;
  try {
    while (pending !== null) {
      const request = pending;
      pending = null;
      await build(request);
      await new Promise((resolve) => setTimeout(resolve, 0));
    }
  } finally {
    running = false;
  }
};
