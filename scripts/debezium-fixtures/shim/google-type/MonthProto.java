// A stand-in (see StandIn.java): google/type/month.proto, empty.
package com.google.type;

public final class MonthProto {
    private static final com.google.protobuf.Descriptors.FileDescriptor FILE = StandIn.file("google/type/month.proto");

    private MonthProto() {
    }

    public static com.google.protobuf.Descriptors.FileDescriptor getDescriptor() {
        return FILE;
    }
}
