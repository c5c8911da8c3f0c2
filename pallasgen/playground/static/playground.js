// The page: sends the spec to the worker as the user types (debounced) and shows what
// comes back. The spec travels in the URL fragment: #example=NAME&spec=TEXT.
const $ = (id) => document.getElementById(id);
const worker = new Worker("worker.js");
let examples = {};
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

function rebuild() {
  clearTimeout(timer);
  updateLink();
  const name = $("examples").value;
  latest += 1;
  status(latest === 1 ? "Loading Pyodide…" : "Building…", "building");
  worker.postMessage({
    id: latest,
    name,
    source: $("spec").value,
    tuning: examples[name].tuning,
    kernel: $("kernel").value || null,
  });
}

worker.onmessage = ({ data }) => {
  if (data.type === "status") return status(data.text, "loading");
  if (data.id !== latest) return; // a newer build is on its way
  if (data.type === "failure") return status(`Failed: ${data.text}`, "failed");
  $("code").textContent = data.code;
  $("diagnostics").textContent = data.diagnostics;
  $("kernel").replaceChildren(...data.kernels.map((k) => new Option(k, k, false, k === data.kernel)));
  $("tiling").innerHTML = data.svg;
  status(`Built in ${Math.round(data.ms)} ms`, "done");
};

// The example and spec a link names (the first example's spec if it names none).
function openFragment() {
  const linked = fragment();
  if (linked.example in examples) $("examples").value = linked.example;
  $("spec").value = linked.spec ?? examples[$("examples").value].spec;
}

async function main() {
  examples = (await (await fetch("site.json")).json()).examples;
  for (const name of Object.keys(examples)) $("examples").append(new Option(name, name));
  openFragment();
  $("examples").onchange = () => {
    $("spec").value = examples[$("examples").value].spec;
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
