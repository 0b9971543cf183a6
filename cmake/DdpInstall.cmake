# `cmake --install build --prefix P`: ddprun, ddp-store-server, libddp as a CMake package
# (find_package(ddp) + target_link_libraries(app ddp::ddp)), ddprun(1), bash and zsh
# completions, examples under share/doc/ddprun/. Components (one Debian package each,
# cmake/DdpPackage.cmake): ddprun, libddp (the shared library), dev (headers, CMake files).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(TARGETS ddp EXPORT ddpTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT libddp NAMELINK_COMPONENT dev
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT libddp)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ddp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
install(TARGETS ddprun ddp-store-server RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ddprun)
# The etcd transport (src/rendezvous/etcd/transport.hpp): ddprun loads <bindir>/../lib/ddprun/etcd-http.so.
install(TARGETS ddprun_etcd_http LIBRARY DESTINATION lib/ddprun COMPONENT ddprun)
# The Python workers' bootstrap and --preload's warm process: ddprun looks for it at <bindir>/../share/ddprun/python.
install(FILES ${PROJECT_SOURCE_DIR}/src/launcher/python/sitecustomize.py
  ${PROJECT_SOURCE_DIR}/src/launcher/python/ddprun_preload.py
  DESTINATION ${CMAKE_INSTALL_DATADIR}/ddprun/python COMPONENT ddprun)
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ddpConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddpConfig.cmake ${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp COMPONENT dev)

# Generated at build time from the flag table (src/docs/).
install(FILES ${DDP_DOCS_DIR}/man/man1/ddprun.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT ddprun)
install(FILES ${DDP_DOCS_DIR}/bash-completion/completions/ddprun
  DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions COMPONENT ddprun)
install(FILES ${DDP_DOCS_DIR}/zsh/vendor-completions/_ddprun
  DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions COMPONENT ddprun)

# Documentation and examples (a Debian package's copyright file lives next to them).
set(_ddp_doc ${CMAKE_INSTALL_DATADIR}/doc/ddprun)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${_ddp_doc} COMPONENT ddprun)
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${_ddp_doc} RENAME copyright COMPONENT ddprun)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/consumer ${PROJECT_SOURCE_DIR}/examples/pytorch
  DESTINATION ${_ddp_doc}/examples COMPONENT ddprun)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docker DESTINATION ${_ddp_doc}/examples COMPONENT ddprun)
if(EXISTS ${PROJECT_SOURCE_DIR}/examples/kubernetes)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/kubernetes DESTINATION ${_ddp_doc}/examples COMPONENT ddprun)
endif()

include(DdpPackage)
