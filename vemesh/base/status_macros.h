// vemesh/base/status_macros.h
//
// Early-return helpers for absl::Status and absl::StatusOr. Abseil has its
// own (absl/status/status_macros.h), but not every distribution ships them
// (Debian's Abseil does not), so vemesh carries these and uses them itself.
//
//   absl::Status Setup() {
//     VEMESH_RETURN_IF_ERROR(Connect());          // returns the error, if any
//     VEMESH_ASSIGN_OR_RETURN(auto mesh, Build());  // mesh is the value
//     VEMESH_ASSIGN_OR_RETURN(int64_t n, mesh.size("TP"));
//     ...
//   }
//
// VEMESH_RETURN_IF_ERROR(expr): `expr` is an absl::Status, or an
// absl::StatusOr<T> (its status is checked; its value is dropped). On error
// the enclosing function returns that status unchanged.
//
// VEMESH_ASSIGN_OR_RETURN(lhs, expr): `expr` is an absl::StatusOr<T>. On
// error the enclosing function returns its status unchanged; otherwise the
// value is moved into `lhs`, a declaration (`auto x`, `const T& y`) or an
// existing lvalue. The macro expands to more than one statement: do not use
// it as the body of an unbraced `if`/`for`. A `lhs` whose type has a comma
// needs parentheses around the whole type, or an alias.
//
// The enclosing function may return absl::Status or any absl::StatusOr<U>
// (both are constructible from a non-OK absl::Status).

#ifndef VEMESH_BASE_STATUS_MACROS_H_
#define VEMESH_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vemesh::status_internal {

inline const absl::Status& AsStatus(const absl::Status& status) {
  return status;
}
inline absl::Status AsStatus(absl::Status&& status) {
  return std::move(status);
}
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& value) {
  return value.status();
}
template <typename T>
absl::Status AsStatus(absl::StatusOr<T>&& value) {
  return std::move(value).status();
}

}  // namespace vemesh::status_internal

#define VEMESH_STATUS_CONCAT_INNER_(a, b) a##b
#define VEMESH_STATUS_CONCAT_(a, b) VEMESH_STATUS_CONCAT_INNER_(a, b)

#define VEMESH_RETURN_IF_ERROR(expr)                             \
  do {                                                           \
    ::absl::Status vemesh_status_macro_ =                        \
        ::vemesh::status_internal::AsStatus(expr);               \
    if (!vemesh_status_macro_.ok()) return vemesh_status_macro_; \
  } while (false)

#define VEMESH_ASSIGN_OR_RETURN(lhs, expr) \
  VEMESH_ASSIGN_OR_RETURN_IMPL_(           \
      VEMESH_STATUS_CONCAT_(vemesh_statusor_, __LINE__), lhs, expr)

#define VEMESH_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)

#endif  // VEMESH_BASE_STATUS_MACROS_H_
