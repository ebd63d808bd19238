// Render a Vega-Lite spec to SVG with the real vega and vega-lite (NODE_PATH: where `make dashboard-tools` put them):
// node render_vega.js SPEC.json OUT.svg. Prints "rendered <bytes>"; a spec Vega-Lite refuses exits 1 with its error.
const fs = require("fs");
const vega = require("vega");
const vegaLite = require("vega-lite");

const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const view = new vega.View(vega.parse(vegaLite.compile(spec).spec), {renderer: "none"});
view.toSVG().then((svg) => {
  fs.writeFileSync(process.argv[3], svg);
  console.log(`rendered ${svg.length}`);
}).catch((error) => {
  console.error(String(error));
  process.exit(1);
});
