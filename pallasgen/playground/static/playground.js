// The page: sends the spec to the worker as the user types (debounced) and shows what
// comes back. The spec travels in the URL fragment: #example=NAME&spec=TEXT.
const $ = (id) => document.getElementById(id);
const worker = new Worker("worker.js");
// A spec that differs from the selected example's is the user's own file: built as
// specs/spec.pallas, without the example's tuning file.
const OWN_NAME = "spec";
let examples = new Map(); // name -> {spec, tuning}: only the site's own examples
let latest = 0;
let timer = null;

function status(text, state) {
  $("status").textContent = text;
  $("status").dataset.state = state;
}

function fragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  return { example: params.get("example"), spec: params.get("spec") };
}

function updateLink() {
  const params = new URLSearchParams({ example: $("examples").value, spec: $("spec").value });
  $("link").href = "#" + params.toString();
}

// What to build: the selected example as its own file while its text is unchanged,
// else the user's spec.
function buildTarget() {
  const example = examples.get($("examples").value);
  const source = $("spec").value;
  if (example && source === example.spec) return { name: $("examples").value, source, tuning: example.tuning };
  return { name: OWN_NAME, source, tuning: null };
}

function rebuild() {
  clearTimeout(timer);
  updateLink();
  latest += 1;
  status(latest === 1 ? "Loading Pyodide…" : "Building…", "building");
  worker.postMessage({ id: latest, ...buildTarget(), kernel: $("kernel").value || null });
}

worker.onmessage = ({ data }) => {
  if (data.type === "status") return status(data.text, "loading");
  if (data.id !== latest) return; // a newer build is on its way
  $("status").dataset.builds = data.builds;
  if (data.type === "failure") return status(`Failed: ${data.text}`, "failed");
  $("code").textContent = data.code;
  $("diagnostics").textContent = data.diagnostics;
  $("kernel").replaceChildren(...data.kernels.map((k) => new Option(k, k, false, k === data.kernel)));
  $("tiling").innerHTML = data.svg;
  status(`Built in ${Math.round(data.ms)} ms`, "done");
};

// The example and spec a link names (the first example's spec if it names none). A name
// that is not one of the site's examples (e.g. `constructor`) is ignored.
function openFragment() {
  const linked = fragment();
  if (linked.example !== null && examples.has(linked.example)) $("examples").value = linked.example;
  $("spec").value = linked.spec ?? examples.get($("examples").value).spec;
}

async function main() {
  const site = await (await fetch("site.json")).json();
  examples = new Map(Object.entries(site.examples));
  for (const name of examples.keys()) $("examples").append(new Option(name, name));
  openFragment();
  $("examples").onchange = () => {
    $("spec").value = examples.get($("examples").value).spec;
    $("kernel").replaceChildren();
    rebuild();
  };
  $("spec").oninput = () => {
    clearTimeout(timer);
    timer = setTimeout(rebuild, 300);
  };
  $("kernel").onchange = rebuild;
  window.onhashchange = () => {
    openFragment();
    rebuild();
  };
  rebuild();
}

main();
