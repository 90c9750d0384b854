# A text file built into a binary: tandem_embed_text(target file namespace name) compiles into
# `target` a generated C++ file that defines
#   extern const std::string_view namespace::name;  // the file's text
# (declare it where it is read). The file is read at build time, so editing it rebuilds the
# target, and the source tree keeps only the text. Used for the flag table (cli/flags.toml).
#
# The same file, run as a script (cmake -P), writes the generated source: IN, OUT, NAMESPACE, NAME.
if(CMAKE_SCRIPT_MODE_FILE)
  file(READ "${IN}" text)
  string(FIND "${text}" ")embedded\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${IN} contains )embedded\" and cannot be a raw string literal")
  endif()
  file(WRITE "${OUT}"
       "// Generated from ${IN} by cmake/EmbedText.cmake.\n"
       "#include <string_view>\n\n"
       "namespace ${NAMESPACE} {\n"
       "extern const std::string_view ${NAME};\n"
       "const std::string_view ${NAME} = R\"embedded(${text})embedded\";\n"
       "}  // namespace ${NAMESPACE}\n")
  return()
endif()

function(tandem_embed_text target file namespace name)
  get_filename_component(in ${file} ABSOLUTE)
  get_filename_component(base ${file} NAME)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${base}.cpp)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DIN=${in} -DOUT=${out} -DNAMESPACE=${namespace} -DNAME=${name}
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedText.cmake
    DEPENDS ${in} ${PROJECT_SOURCE_DIR}/cmake/EmbedText.cmake
    COMMENT "Embedding ${file}"
    VERBATIM)
  target_sources(${target} PRIVATE ${out})
endfunction()
