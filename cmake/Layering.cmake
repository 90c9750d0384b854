# Which folder's headers a library may include, checked when CMake configures: a source or
# header of `folder` that includes "other/..." fails the configure step unless `other` is the
# folder itself or one listed. Folders map to the libraries that own them, so this is the
# include side of each target's link line (docs/ARCHITECTURE.md, "Libraries").
# Generated proto headers ("tandem/v1/...") count as folder `proto`; "tandem/bench.h" as `harness`;
# the client library's other public headers ("tandem/...") as folder `client`; tandem/status.h and
# runtime/{status,utf8,json,json_value}.h (target tandem_base) as `base`. The base's own files
# (those headers and json_value.cpp, in runtime/) may include only the base.
function(tandem_layering folder)
  set(allowed ${folder} ${ARGN})
  file(GLOB_RECURSE files RELATIVE ${PROJECT_SOURCE_DIR}
       ${PROJECT_SOURCE_DIR}/${folder}/*.h ${PROJECT_SOURCE_DIR}/${folder}/*.cpp)
  foreach(f ${files})
    file(STRINGS ${PROJECT_SOURCE_DIR}/${f} lines REGEX "^#include \"")
    foreach(line ${lines})
      string(REGEX MATCH "^#include \"([^\"]+)\"" _ "${line}")
      set(path ${CMAKE_MATCH_1})
      if(path MATCHES "^(runtime/(status|utf8|json|json_value)|tandem/status)\\.h$")
        set(dep base)
      elseif(path MATCHES "^tandem/v1/")
        set(dep proto)
      elseif(path STREQUAL "tandem/bench.h")
        set(dep harness)
      elseif(path MATCHES "^tandem/")
        set(dep client)
      elseif(path MATCHES "^([a-z_]+)/")
        set(dep ${CMAKE_MATCH_1})
      else()
        continue()  # a header beside the including file
      endif()
      if(folder MATCHES "^workers/engine" AND dep STREQUAL "workers" AND path MATCHES "^workers/engine/")
        continue()
      endif()
      list(FIND allowed ${dep} at)
      if(f MATCHES "^runtime/(status|utf8|json|json_value)\\.(h|cpp)$" AND NOT dep STREQUAL "base")
        message(FATAL_ERROR "${f} includes \"${path}\": the base (tandem_base) may include only the base")
      endif()
      if(at EQUAL -1)
        message(FATAL_ERROR "${f} includes \"${path}\": ${folder}/ may include only ${allowed}")
      endif()
    endforeach()
  endforeach()
endfunction()
