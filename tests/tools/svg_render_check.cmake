# Renders `vemesh plan --format svg` with a real SVG renderer (rsvg-convert,
# Debian's librsvg2-bin) and checks that a non-trivial PNG came out.
# -DVEMESH=<cli> -DRSVG=<rsvg-convert or empty> -DOUT=<dir> -DMESH=<spec>
# -DPER_HOST=<n> (or "-" for none), optionally -DPLACEMENT=<block|cyclic|
# hostfile:FILE> and -DHOSTS=<n>. Exits with "SKIP:" (the test's SKIP_REGULAR_EXPRESSION) when
# no renderer is installed.
if(NOT RSVG)
  message("SKIP: rsvg-convert not found (install librsvg2-bin: bash scripts/setup.sh)")
  return()
endif()
file(MAKE_DIRECTORY ${OUT})
set(svg ${OUT}/plan.svg)
set(png ${OUT}/plan.png)
file(REMOVE ${svg} ${png})
set(flags)
if(NOT PER_HOST STREQUAL "-")
  list(APPEND flags --ranks-per-host ${PER_HOST})
endif()
if(PLACEMENT)
  list(APPEND flags --placement ${PLACEMENT})
endif()
if(HOSTS)
  list(APPEND flags --hosts ${HOSTS})
endif()
execute_process(COMMAND ${VEMESH} plan --mesh ${MESH} ${flags}
                        --format svg --output ${svg}
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "vemesh plan failed (${rc}): ${err}")
endif()
execute_process(COMMAND ${RSVG} -o ${png} ${svg} RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "rsvg-convert rejected the SVG (${rc}): ${err}")
endif()
file(SIZE ${png} size)
file(READ ${png} magic LIMIT 8 HEX)
if(NOT magic STREQUAL "89504e470d0a1a0a")
  message(FATAL_ERROR "${png} is not a PNG (starts with ${magic})")
endif()
# A blank or tiny image compresses to a few hundred bytes; a drawn plan with
# text and coloured cells is tens of kilobytes.
if(size LESS 8000)
  message(FATAL_ERROR "${png} is only ${size} bytes: nothing was drawn")
endif()
message("rendered ${MESH}: ${png} (${size} bytes)")
