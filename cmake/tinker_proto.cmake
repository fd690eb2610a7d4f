# rlforge_generate_tinker_proto(<out_dir>): generates <out_dir>/service/tinker.pb.{h,cc} from
# service/tinker.proto with protoc at build time (code includes "service/tinker.pb.h" with
# <out_dir> on its include path). A custom command's outputs belong to the directory that
# declares it, so service/ and fuzz/ each generate their own copy.
function(rlforge_generate_tinker_proto out_dir)
  set(proto ${PROJECT_SOURCE_DIR}/service/tinker.proto)
  add_custom_command(
    OUTPUT ${out_dir}/service/tinker.pb.cc ${out_dir}/service/tinker.pb.h
    COMMAND ${CMAKE_COMMAND} -E make_directory ${out_dir}
    COMMAND protobuf::protoc --cpp_out=${out_dir} -I${PROJECT_SOURCE_DIR} ${proto}
    DEPENDS ${proto} protobuf::protoc
    COMMENT "protoc service/tinker.proto"
    VERBATIM)
endfunction()
