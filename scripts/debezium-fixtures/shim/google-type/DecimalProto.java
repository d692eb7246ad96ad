// A stand-in (see StandIn.java): google/type/decimal.proto, empty.
package com.google.type;

public final class DecimalProto {
    private static final com.google.protobuf.Descriptors.FileDescriptor FILE = StandIn.file("google/type/decimal.proto");

    private DecimalProto() {
    }

    public static com.google.protobuf.Descriptors.FileDescriptor getDescriptor() {
        return FILE;
    }
}
