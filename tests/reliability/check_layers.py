#!/usr/bin/env python3
"""Checks that vemesh's floors include only downwards.

  python3 tests/reliability/check_layers.py [SOURCE_DIR]

Reads every #include "vemesh/..." in the .h and .cc files under vemesh/ and
fails (exit 1), naming file and line, when
  - a floor includes a floor above it in the order
      base < layout < placement < rendezvous < comm < checkpoint
           < bootstrap < mesh < elastic < registry < strategies
    (a floor may include itself and any floor below);
  - a public header includes an internal/ header (internal/ is not
    installed, so the public header would not compile once installed);
  - a floor includes another floor's internal/ header.
vemesh/vemesh.h, the umbrella header, sits above every floor but strategies.
"""

import pathlib
import re
import sys

FLOORS = ["base", "layout", "placement", "rendezvous", "comm", "checkpoint",
          "bootstrap", "mesh", "elastic", "registry", "strategies"]
UMBRELLA = "vemesh.h"
INCLUDE = re.compile(r'^\s*#\s*include\s+"vemesh/([^"]+)"')


def floor_of(relative):
  """The floor of a path relative to vemesh/, or None when it has none."""
  first = relative.split("/", 1)[0]
  return first if first in FLOORS else None


def check(source_dir):
  root = source_dir / "vemesh"
  problems = []
  files = sorted(p for p in root.rglob("*") if p.suffix in (".h", ".cc"))
  for path in files:
    relative = path.relative_to(root).as_posix()
    shown = path.relative_to(source_dir).as_posix()
    if relative == UMBRELLA:
      rank = FLOORS.index("registry")
      own = None
    else:
      own = floor_of(relative)
      if own is None:
        problems.append(f"{shown}: not in any floor ({', '.join(FLOORS)})")
        continue
      rank = FLOORS.index(own)
    public_header = path.suffix == ".h" and "/internal/" not in "/" + relative
    for number, line in enumerate(path.read_text().splitlines(), 1):
      match = INCLUDE.match(line)
      if not match:
        continue
      target = match.group(1)
      where = f"{shown}:{number}: includes vemesh/{target}"
      target_floor = floor_of(target)
      if target_floor is None:
        problems.append(f"{where}, which is in no floor")
        continue
      if FLOORS.index(target_floor) > rank:
        problems.append(f"{where}: floor '{target_floor}' is above "
                        f"'{own or UMBRELLA}'")
      if "/internal/" in "/" + target:
        if public_header:
          problems.append(f"{where}: a public header includes an internal "
                          "one (internal/ headers are not installed)")
        elif target_floor != own:
          problems.append(f"{where}: another floor's internal header")
  return len(files), problems


def main():
  source_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                            pathlib.Path(__file__).resolve().parents[2])
  count, problems = check(source_dir.resolve())
  for problem in problems:
    print(problem)
  if problems:
    print(f"check_layers: {len(problems)} violation(s) in {count} files")
    return 1
  print(f"check_layers: {count} files include only downwards")
  return 0


if __name__ == "__main__":
  sys.exit(main())
