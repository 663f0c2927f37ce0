# Warnings for the project's own targets (not for third-party headers).
function(vemesh_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror -Wno-unused-parameter)
endfunction()
