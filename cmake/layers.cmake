# One library target per src/ folder, with its dependencies declared, so that an include going
# the wrong way fails to compile instead of waiting for a reviewer to notice.
#
# A folder's headers are reachable only through its "view": ${KRUG_LAYER_VIEWS}/<name>/<folder>/,
# a directory of symlinks to that folder's own headers (not its subfolders'). A target sees the
# views of itself and of the layers it declares, nothing else; src/ itself is on no layer's
# include path. So with
#   krug_layer(net FOLDER net)
# a `#include "engine/engine.h"` in src/net/socket.cc is "No such file or directory".
#
# Each layer is two targets:
#   krug_<name>_headers  INTERFACE: the view, and the headers targets of its PUBLIC dependencies
#                        (what its own headers include); what dependents link to.
#   krug_<name>          OBJECT: its sources, compiled with its own and its dependencies' views.
# The OBJECT libraries never link one another (only headers targets), so their objects go into
# libkrug.so once, and a frontend library can use a layer's headers without duplicating its code.
#
# krug_layer(<name> FOLDER <folder under src/> [SOURCES <files>] [PUBLIC <layers>]
#            [PRIVATE <layers>] [LIBS <imported targets>])
# SOURCES defaults to src/<folder>/*.cc; PUBLIC/PRIVATE name other layers; LIBS are third-party
# targets its sources compile against (linked into libkrug.so by the caller).
set(KRUG_LAYER_VIEWS ${CMAKE_BINARY_DIR}/layers)

function(krug_layer_view name folder)
  set(view ${KRUG_LAYER_VIEWS}/${name})
  file(REMOVE_RECURSE ${view})
  file(MAKE_DIRECTORY ${view}/${folder})
  file(GLOB headers CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/${folder}/*.h)
  foreach(header ${headers})
    get_filename_component(file ${header} NAME)
    file(CREATE_LINK ${header} ${view}/${folder}/${file} SYMBOLIC)
  endforeach()
  add_library(krug_${name}_headers INTERFACE)
  target_include_directories(krug_${name}_headers INTERFACE
    $<BUILD_INTERFACE:${view}> $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>)
endfunction()

function(krug_layer name)
  cmake_parse_arguments(L "" "FOLDER" "SOURCES;PUBLIC;PRIVATE;LIBS" ${ARGN})
  if(NOT L_SOURCES)
    file(GLOB L_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/${L_FOLDER}/*.cc)
  endif()
  krug_layer_view(${name} ${L_FOLDER})
  foreach(dep ${L_PUBLIC})
    target_link_libraries(krug_${name}_headers INTERFACE krug_${dep}_headers)
  endforeach()
  add_library(krug_${name} OBJECT ${L_SOURCES})
  target_link_libraries(krug_${name} PRIVATE krug_${name}_headers ${L_LIBS})
  foreach(dep ${L_PRIVATE})
    target_link_libraries(krug_${name} PRIVATE krug_${dep}_headers)
  endforeach()
  set_property(GLOBAL APPEND PROPERTY KRUG_LAYERS krug_${name})
endfunction()
