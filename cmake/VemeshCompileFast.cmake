# Unity builds for vemesh's own targets (issue 40): each target's sources
# are compiled in batches of VEMESH_UNITY_BATCH files, so the headers they
# share (the standard library, Abseil, MPI, Gloo) are parsed and their
# templates instantiated once per batch instead of once per file. The main
# job's build (library + train_nd, 2 cores, Ninja) took 104 s file by file,
# 46 s in batches of 8 (bench/RESULTS.md section 16). A precompiled
# header per floor was tried and dropped: with batches, its own compile
# (about 3.5 s per target) cost more than it saved.
#
# A file's anonymous-namespace names must therefore differ from those of
# the other files of its target: what is the same concept is shared (a
# floor's internal/ header), what differs is named apart. The tsan preset
# compiles each target as a single batch (VEMESH_UNITY_BATCH=0), so a clash
# fails CI whatever the batch size.
# -DVEMESH_UNITY_BUILD=OFF compiles each file alone, exactly as written
# (clang-tidy, include-what-you-use, hunting a missing include).
option(VEMESH_UNITY_BUILD "Compile each vemesh target's sources in batches" ON)
set(VEMESH_UNITY_BATCH 8 CACHE STRING "Sources per unity batch")

# vemesh_compile_fast(<target>): its sources built in unity batches.
function(vemesh_compile_fast target)
  if(VEMESH_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON
      UNITY_BUILD_BATCH_SIZE ${VEMESH_UNITY_BATCH})
  endif()
endfunction()
