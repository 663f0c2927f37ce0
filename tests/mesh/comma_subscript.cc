// Must NOT compile: `mesh["DP", "TP"]` is the comma operator (it would be
// mesh["TP"]). Compiled by the device_mesh.comma_subscript.* tests, never
// built into a target. With -DVEMESH_BRACES it is the right spelling and
// must compile (the control).
#include "vemesh/mesh/device_mesh.h"

void Use(const vemesh::DeviceMesh& mesh) {
#ifdef VEMESH_BRACES
  (void)mesh[{"DP", "TP"}];
#else
  (void)mesh["DP", "TP"];
#endif
}
