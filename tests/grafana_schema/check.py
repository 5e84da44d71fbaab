"""Hold dashboards/*.json to Grafana's published dashboard schema: the TypeScript types of @grafana/schema (the
version of the Grafana that deploy/docker-compose.yml runs), checked by the TypeScript compiler.

Each dashboard becomes one TypeScript file: the whole dashboard typed as the schema's ``Dashboard`` (variables,
links, annotations, time settings, every panel's common fields), and each panel again typed with its panel
plugin's own ``Options`` and ``FieldConfig`` (timeseries, stat, table). TypeScript rejects a missing required
field, a value of the wrong type or an enum value the schema does not list, and, for these object literals,
any field the schema does not have.

    python tests/grafana_schema/check.py dashboards/*.json     # prints tsc's errors; exit status 1 on any
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RAW = "@grafana/schema/dist/types/raw"
PLUGINS = ("timeseries", "stat", "table")

PRELUDE = f"""import type * as dash from "{RAW}/dashboard/x/types.gen";
""" + "".join(f'import type * as {p} from "{RAW}/composable/{p}/panelcfg/x/types.gen";\n' for p in PLUGINS) + """
// JSON holds an enum's value ("line"), not the TypeScript enum member: each string enum read as its values.
type Json<T> = T extends string ? `${T}` : T extends readonly (infer U)[] ? Json<U>[] : T extends object ? { [K in keyof T]: Json<T[K]> } : T;
// A panel plugin's options may be left out: Grafana fills each from the plugin's defaults (their types and
// names still hold).
type Optional<T> = T extends readonly (infer U)[] ? Optional<U>[] : T extends object ? { [K in keyof T]?: Optional<T[K]> } : T;
type Strict<Options, Custom> = Json<Omit<dash.Panel, "options" | "fieldConfig"> & {
  options: Optional<Options>;
  fieldConfig: { defaults: Omit<dash.FieldConfig, "custom"> & { custom?: Optional<Custom> }; overrides: dash.FieldConfigSource["overrides"] };
}>;
"""
CUSTOM = {"timeseries": "timeseries.FieldConfig", "stat": "Record<string, never>", "table": "table.FieldConfig"}


def typescript(dashboard: dict) -> str:
    lines = [PRELUDE, f"export const dashboard: Json<dash.Dashboard> = {json.dumps(dashboard, indent=1)};"]
    panels = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    for i, panel in enumerate(panels):
        kind = panel["type"]
        if kind == "row":
            lines.append(f"export const panel{i}: Json<dash.RowPanel> = {json.dumps(panel)};")
        elif kind in PLUGINS:
            lines.append(f"export const panel{i}: Strict<{kind}.Options, {CUSTOM[kind]}> = {json.dumps(panel)};")
        else:
            raise ValueError(f"{panel.get('title')}: no schema here for panel type {kind!r}")
    return "\n".join(lines) + "\n"


def check(paths: list[str]) -> tuple[int, str]:
    """(tsc's exit status, its messages with file names as given)."""
    tsc = os.path.join(HERE, "node_modules", "typescript", "bin", "tsc")
    if not os.path.exists(tsc):
        raise FileNotFoundError(f"{tsc}: run `npm ci --prefix {os.path.relpath(HERE)}` first")
    with tempfile.TemporaryDirectory(dir=HERE) as work:
        files = {}
        for path in paths:
            with open(path) as f:
                dashboard = json.load(f)
            ts = os.path.join(work, os.path.basename(path).replace(".json", ".ts"))
            with open(ts, "w") as f:
                f.write(typescript(dashboard))
            files[ts] = path
        done = subprocess.run(
            ["node", tsc, "--noEmit", "--strict", "--moduleResolution", "node", "--module", "commonjs",
             "--target", "es2020", "--skipLibCheck", *files],
            capture_output=True, text=True, cwd=HERE,
        )  # fmt: skip
    out = done.stdout + done.stderr
    for ts, path in files.items():
        out = out.replace(os.path.relpath(ts, HERE), f"{path} as TypeScript, line/column")
    return done.returncode, out


if __name__ == "__main__":
    status, messages = check(sys.argv[1:])
    print(messages, end="")
    sys.exit(status)
