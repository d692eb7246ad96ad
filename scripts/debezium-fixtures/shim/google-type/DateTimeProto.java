// A stand-in (see StandIn.java): google/type/datetime.proto, empty.
package com.google.type;

public final class DateTimeProto {
    private static final com.google.protobuf.Descriptors.FileDescriptor FILE = StandIn.file("google/type/datetime.proto");

    private DateTimeProto() {
    }

    public static com.google.protobuf.Descriptors.FileDescriptor getDescriptor() {
        return FILE;
    }
}
