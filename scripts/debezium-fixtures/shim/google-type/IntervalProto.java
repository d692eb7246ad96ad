// A stand-in (see StandIn.java): google/type/interval.proto, empty.
package com.google.type;

public final class IntervalProto {
    private static final com.google.protobuf.Descriptors.FileDescriptor FILE = StandIn.file("google/type/interval.proto");

    private IntervalProto() {
    }

    public static com.google.protobuf.Descriptors.FileDescriptor getDescriptor() {
        return FILE;
    }
}
