// A stand-in (see StandIn.java): google/type/phone_number.proto, empty.
package com.google.type;

public final class PhoneNumberProto {
    private static final com.google.protobuf.Descriptors.FileDescriptor FILE = StandIn.file("google/type/phone_number.proto");

    private PhoneNumberProto() {
    }

    public static com.google.protobuf.Descriptors.FileDescriptor getDescriptor() {
        return FILE;
    }
}
