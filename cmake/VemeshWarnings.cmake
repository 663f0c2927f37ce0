# Warnings for the project's own targets (not for third-party headers).
# In a unity build (cmake/VemeshCompileFast.cmake) a .cc is included
# into a batch file, so g++ would flag a class of that .cc whose member's
# type sits in its anonymous namespace (-Wsubobject-linkage): harmless
# inside one .cc, meaningful only for headers, which a unity build does not
# change.
function(vemesh_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror -Wno-unused-parameter
    $<$<AND:$<CXX_COMPILER_ID:GNU>,$<BOOL:$<TARGET_PROPERTY:UNITY_BUILD>>>:-Wno-subobject-linkage>)
endfunction()
