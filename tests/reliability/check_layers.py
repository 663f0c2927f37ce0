#!/usr/bin/env python3
"""Checks vemesh's includes against the floor graph the build links.

  python3 tests/reliability/check_layers.py FLOORS_JSON [SOURCE_DIR]
  python3 tests/reliability/check_layers.py --self-test

FLOORS_JSON is the graph vemesh/CMakeLists.txt records at configure time
(${PROJECT_BINARY_DIR}/vemesh_floors.json): each floor (folder of vemesh/)
and the floors its target_link_libraries call names; the umbrella header
vemesh/vemesh.h belongs to the node named by "umbrella". The graph is kept
there only: nothing here lists the floors.

Every include is read, in each of its forms: "vemesh/x/y.h", <vemesh/x/y.h>,
and a relative one ("../comm/foo.h", "internal/foo.h", "foo.h"), resolved
against the including file's folder. It fails (exit 1), printing
file:line, the include and the rule, when
  - floors: a floor includes a floor it does not reach in the graph (a
    floor may include itself and every floor its links reach);
  - internal: a public header includes an internal/ header (internal/ is
    not installed, so the public header would not compile once installed),
    or a floor includes another floor's internal/ header;
  - users: a file under python/, tools/, examples/ or bench/ includes a
    header under any internal/ folder of vemesh/ (tests/ may);
  - backends: a file of vemesh/ outside comm/ and bootstrap/ includes a
    backend folder (comm/gloo/, comm/mpi/, comm/nccl/, bootstrap/mpi/),
    except the headers BACKEND_EXCEPTIONS allows it.
--self-test writes bad trees into a temporary folder and fails unless the
check flags each one (and passes a good one).
"""

import json
import os
import pathlib
import re
import sys
import tempfile

SOURCE_SUFFIXES = {".h", ".hh", ".hpp", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".inc"}
# The library's users: none may include a private (internal/) header.
USER_DIRS = ["python", "tools", "examples", "bench"]
BACKENDS = ["comm/gloo/", "comm/mpi/", "comm/nccl/", "bootstrap/mpi/"]
BACKEND_OWNERS = ["comm/", "bootstrap/"]
# The files outside comm/ and bootstrap/ that include a backend folder, and
# exactly the backend headers each includes today. In mesh/, only the
# backend plan (issue 39 item 1): mesh creation asks it for each backend's
# groups and names no backend, and NcclOptions is comm/nccl_options.h.
BACKEND_EXCEPTIONS = {
    # The mesh's backend plan.
    "mesh/mesh_backends.cc": {"comm/gloo/gloo_communicator.h",
                              "comm/nccl/nccl_communicator.h"},
    "mesh/internal/mesh_backends.h": {"comm/nccl/cuda_device.h"},
    # The elastic group factory.
    "elastic/elastic_establish.cc": {"comm/gloo/gloo_communicator.h",
                                     "comm/nccl/nccl_communicator.h"},
    "elastic/elastic_mesh.cc": {"comm/nccl/nccl_communicator.h"},
    "elastic/elastic_mesh.h": {"comm/nccl/cuda_device.h"},
    # The registry, which asks MPI whether this thread may free a mesh.
    "registry/ve_device_mesh_init.cc": {"comm/mpi/mpi_environment.h"},
}
# The umbrella header (vemesh/vemesh.h) is the whole public surface,
# backends included: the rule does not apply to it.

INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')


def load_graph(floors_json):
  data = json.loads(pathlib.Path(floors_json).read_text())
  graph = {name: list(deps) for name, deps in data["floors"].items()}
  return graph, data.get("umbrella", "vemesh")


def reach(graph, start):
  """Every node reachable from start, start included."""
  seen, todo = set(), [start]
  while todo:
    node = todo.pop()
    if node not in seen:
      seen.add(node)
      todo.extend(graph.get(node, []))
  return seen


def is_internal(relative):
  return "/internal/" in "/" + relative


def resolve(source_dir, path, quoted, target):
  """The included file's path relative to vemesh/, or None when the include
  is not one of vemesh's headers."""
  if target.startswith("vemesh/"):
    return target[len("vemesh/"):]
  if not quoted:
    return None
  # A relative include: the including file's folder first. A path with ./
  # or ../ is taken as written even when it does not exist.
  candidate = pathlib.Path(os.path.normpath(path.parent / target))
  explicit = target.startswith("./") or target.startswith("../")
  if not (explicit or candidate.is_file()):
    return None
  try:
    return candidate.relative_to(source_dir / "vemesh").as_posix()
  except ValueError:
    return None


def files_under(folder):
  if not folder.is_dir():
    return []
  return sorted(p for p in folder.rglob("*")
                if p.suffix in SOURCE_SUFFIXES and p.is_file())


def includes(source_dir, path):
  """(line number, include as written, path relative to vemesh/) for each
  include of a vemesh header in path."""
  text = path.read_text(errors="replace")
  for number, line in enumerate(text.splitlines(), 1):
    match = INCLUDE.match(line)
    if not match:
      continue
    quoted = match.group(1) is not None
    target = match.group(1) if quoted else match.group(2)
    relative = resolve(source_dir, path, quoted, target)
    if relative is not None:
      shown = f'"{target}"' if quoted else f"<{target}>"
      yield number, shown, relative


def check(source_dir, graph, umbrella, backend_exceptions=None):
  if backend_exceptions is None:
    backend_exceptions = BACKEND_EXCEPTIONS
  root = source_dir / "vemesh"
  problems = []
  floors = sorted(name for name in graph if name != umbrella)

  def floor_of(relative):
    parts = relative.split("/")
    if len(parts) == 1:
      return umbrella
    return parts[0] if parts[0] in graph and parts[0] != umbrella else None

  files = files_under(root)
  # Each exception must still be used: an entry whose file no longer
  # includes that header is stale (a split moved the include elsewhere).
  unused = {(f, h) for f, headers in backend_exceptions.items() for h in headers}
  for path in files:
    relative = path.relative_to(root).as_posix()
    shown = path.relative_to(source_dir).as_posix()
    own = floor_of(relative)
    if own is None:
      problems.append(f"{shown}: [floors] not in any floor ({', '.join(floors)})")
      continue
    allowed = reach(graph, own)
    public_header = path.suffix in (".h", ".hh", ".hpp", ".cuh") and not is_internal(relative)
    for number, written, target in includes(source_dir, path):
      where = f"{shown}:{number}: includes {written} (vemesh/{target})"
      target_floor = floor_of(target)
      if target_floor is None:
        problems.append(f"{where}: [floors] which is in no floor")
        continue
      if target_floor not in allowed:
        problems.append(f"{where}: [floors] floor '{own}' does not link "
                        f"'{target_floor}' (not reachable in the floor graph)")
      if is_internal(target):
        if public_header:
          problems.append(f"{where}: [internal] a public header includes an "
                          "internal one (internal/ headers are not installed)")
        elif target_floor != own:
          problems.append(f"{where}: [internal] another floor's internal header")
      unused.discard((relative, target))
      if (own != umbrella and any(target.startswith(b) for b in BACKENDS)
          and not any(relative.startswith(o) for o in BACKEND_OWNERS)
          and target not in backend_exceptions.get(relative, set())):
        problems.append(f"{where}: [backends] only comm/, bootstrap/ and the "
                        "backend plan (check_layers.py's BACKEND_EXCEPTIONS) "
                        "include a backend folder")
  for stale_file, header in sorted(unused):
    problems.append(f"vemesh/{stale_file}: [backends] BACKEND_EXCEPTIONS allows it "
                    f"vemesh/{header}, which it no longer includes: remove the entry")
  count = len(files)
  for user in USER_DIRS:
    for path in files_under(source_dir / user):
      count += 1
      shown = path.relative_to(source_dir).as_posix()
      for number, written, target in includes(source_dir, path):
        if is_internal(target):
          problems.append(f"{shown}:{number}: includes {written} (vemesh/{target}): "
                          f"[users] {user}/ includes a private internal/ header")
  return count, problems


def run(floors_json, source_dir):
  if not pathlib.Path(floors_json).is_file():
    print(f"check_layers: no floor graph at {floors_json} (the build writes "
          "vemesh_floors.json into its folder when CMake configures it)")
    return 2
  graph, umbrella = load_graph(floors_json)
  count, problems = check(source_dir.resolve(), graph, umbrella)
  for problem in problems:
    print(problem)
  if problems:
    print(f"check_layers: {len(problems)} violation(s) in {count} files")
    return 1
  print(f"check_layers: {count} files include only what their floors link")
  return 0


# --self-test: each bad tree, the rule it breaks, and the file:line the check
# must name.
SELF_TEST_GRAPH = {
    "umbrella": "vemesh",
    "floors": {"base": [], "layout": ["base"], "comm": ["base"],
               "mesh": ["comm", "layout"], "elastic": ["mesh"],
               "vemesh": ["base", "layout", "comm", "mesh", "elastic"]},
}
SELF_TEST_GOOD = {
    "vemesh/base/log.h": "",
    "vemesh/layout/layout.h": '#include "vemesh/base/log.h"\n',
    "vemesh/comm/comm.h": '#include "vemesh/base/log.h"\n',
    "vemesh/comm/internal/detail.h": "",
    "vemesh/comm/comm.cc": '#include "internal/detail.h"\n#include "comm.h"\n',
    "vemesh/comm/gloo/gloo.h": '#include "../comm.h"\n',
    "vemesh/mesh/mesh.h": ('#include <vemesh/layout/layout.h>\n'
                           '#include "../base/log.h"\n#include "absl/types/span.h"\n'
                           '#include <vector>\n'),
    "vemesh/mesh/mesh_backends.cc": '#include "vemesh/comm/gloo/gloo.h"\n',
    "vemesh/vemesh.h": '#include "vemesh/mesh/mesh.h"\n#include "vemesh/comm/gloo/gloo.h"\n',
    "examples/demo.cc": '#include "vemesh/mesh/mesh.h"\n',
    "vemesh/comm/mpi/mpi.h": "",
    "tests/comm_test.cc": '#include "vemesh/comm/internal/detail.h"\n',
}
SELF_TEST_EXCEPTIONS = {"mesh/mesh_backends.cc": {"comm/gloo/gloo.h"}}
SELF_TEST_BAD = [
    ("an upward include", "vemesh/layout/bad.h",
     '#include "vemesh/base/log.h"\n#include "vemesh/mesh/mesh.h"\n', 2, "[floors]"),
    ("an include of a floor not linked (a DAG, not an order)", "vemesh/layout/side.cc",
     '#include "vemesh/comm/comm.h"\n', 1, "[floors]"),
    ("a relative upward include", "vemesh/comm/up.cc",
     '#include "comm.h"\n#include "../mesh/mesh.h"\n', 2, "[floors]"),
    ("an <...> upward include", "vemesh/base/angle.h",
     '#include <vemesh/layout/layout.h>\n', 1, "[floors]"),
    ("a relative ../../ upward include from an internal/ folder", "vemesh/base/internal/x.h",
     '#include "../../elastic/e.h"\n', 1, "[floors]"),
    ("a public header including an internal one", "vemesh/comm/pub.h",
     '#include "internal/detail.h"\n', 1, "[internal]"),
    ("another floor's internal header", "vemesh/mesh/peek.cc",
     '#include "vemesh/comm/internal/detail.h"\n', 1, "[internal]"),
    ("an examples/ file including an internal/ header", "examples/peek.cc",
     '#include <vector>\n#include "vemesh/comm/internal/detail.h"\n', 2, "[users]"),
    ("a bench/ file including an internal/ header relatively", "bench/peek.cc",
     '#include "../vemesh/comm/internal/detail.h"\n', 1, "[users]"),
    ("a backend include from a forbidden floor", "vemesh/elastic/group.cc",
     '#include "vemesh/mesh/mesh.h"\n#include "vemesh/comm/gloo/gloo.h"\n', 2, "[backends]"),
    ("an allowed exception including another backend header", "vemesh/mesh/mesh_backends.cc",
     '#include "vemesh/comm/gloo/gloo.h"\n#include "vemesh/comm/mpi/mpi.h"\n', 2, "[backends]"),
    ("an include of the umbrella from a floor", "vemesh/elastic/all.cc",
     '#include "vemesh/vemesh.h"\n', 1, "[floors]"),
    ("a file in no floor", "vemesh/stray/stray.h", "", None, "[floors]"),
]


def write_tree(root, files):
  for name, text in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def self_test():
  failures = []
  with tempfile.TemporaryDirectory(prefix="check_layers.") as temp:
    temp = pathlib.Path(temp)
    graph_file = temp / "vemesh_floors.json"
    graph_file.write_text(json.dumps(SELF_TEST_GRAPH))
    graph, umbrella = load_graph(graph_file)
    good = temp / "good"
    write_tree(good, SELF_TEST_GOOD)
    _, problems = check(good.resolve(), graph, umbrella, SELF_TEST_EXCEPTIONS)
    if problems:
      failures.append("the good tree was flagged:\n    " + "\n    ".join(problems))
    # Each bad file alone in a copy of the good tree (the e.h the relative
    # case names is there, so that only the rule can flag it).
    for index, (what, name, text, line, rule) in enumerate(SELF_TEST_BAD):
      tree = temp / f"bad{index}"
      write_tree(tree, SELF_TEST_GOOD)
      write_tree(tree, {"vemesh/elastic/e.h": "", name: text})
      _, problems = check(tree.resolve(), graph, umbrella, SELF_TEST_EXCEPTIONS)
      where = f"{name}:{line}:" if line is not None else f"{name}:"
      hits = [p for p in problems if p.startswith(where) and rule in p]
      if not hits or len(problems) != len(hits):
        failures.append(f"{what} ({name}): expected {rule} at {where}, got "
                        f"{problems or 'nothing'}")
      else:
        print(f"flagged {what}: {hits[0]}")
  for failure in failures:
    print(f"FAIL: {failure}")
  if failures:
    print(f"check_layers --self-test: {len(failures)} of {len(SELF_TEST_BAD) + 1} cases failed")
    return 1
  print(f"check_layers --self-test: all {len(SELF_TEST_BAD)} bad trees flagged, "
        "the good one passes")
  return 0


def main(argv):
  if argv[1:2] == ["--self-test"]:
    return self_test()
  if len(argv) < 2:
    print(__doc__)
    return 2
  source_dir = pathlib.Path(argv[2] if len(argv) > 2 else
                            pathlib.Path(__file__).resolve().parents[2])
  return run(argv[1], source_dir)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
