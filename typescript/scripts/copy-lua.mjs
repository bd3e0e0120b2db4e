// The build's first step: the Python package's shipped scripts (the one source of the enqueue and
// outcome Lua) copied into dist/lua, where the client reads them. tests/integrations/
// test_typescript_client.py pins the copies equal to the sources.
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const source = join(here, "..", "..", "src", "sessionfork", "protocol", "scripts");
const target = join(here, "..", "dist", "lua");
mkdirSync(target, { recursive: true });
for (const name of ["enqueue.lua", "outcome.lua"]) {
  copyFileSync(join(source, name), join(target, name));
}
